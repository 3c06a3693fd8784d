"""``deepspeed.moe.sharded_moe``: the gate and the layer's inner module, names scripts import."""
from launcher.zero.experts.gating import gumbel as gumbel_rsample  # noqa: F401
from launcher.zero.experts.gating import jitter as multiplicative_jitter  # noqa: F401
from launcher.zero.experts.layer import MOELayer, TopKGate  # noqa: F401

"""``deepspeed.moe.layer``: the ``MoE`` layer."""
from launcher.zero.experts.layer import MoE  # noqa: F401

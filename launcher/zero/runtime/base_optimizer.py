"""``deepspeed.runtime.base_optimizer``: the types of the optimizer ``initialize`` returns (``isinstance`` checks)."""
from launcher.zero.engine.zero_optimizer import DeepSpeedOptimizer, ZeROOptimizer  # noqa: F401

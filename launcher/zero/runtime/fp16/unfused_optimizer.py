"""``deepspeed.runtime.fp16.unfused_optimizer``: ``FP16_UnfusedOptimizer``, a type for ``isinstance`` checks
(False for this engine's optimizer); building one is not supported."""
from launcher.zero.shim.stand_ins import FP16_UnfusedOptimizer  # noqa: F401

"""``deepspeed.runtime.fp16.fused_optimizer``: ``FP16_Optimizer``, a type for ``isinstance`` checks (this
engine's optimizer is its ZeRO optimizer at every stage, so they are False); building one is not supported."""
from launcher.zero.shim.stand_ins import FP16_Optimizer  # noqa: F401

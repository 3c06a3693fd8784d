"""``deepspeed.runtime.bf16_optimizer``: ``BF16_Optimizer``, a type for ``isinstance`` checks (False for
this engine's optimizer, its ZeRO optimizer at every stage); building one is not supported."""
from launcher.zero.shim.stand_ins import BF16_Optimizer  # noqa: F401

"""``deepspeed.ops.adam``: ``FusedAdam`` and ``DeepSpeedCPUAdam`` with DeepSpeed's defaults."""
from launcher.zero.optim.adam import DeepSpeedCPUAdam, FusedAdam  # noqa: F401

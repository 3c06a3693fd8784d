"""``deepspeed.accelerator``: ``get_accelerator()``, the device a rank trains on (CUDA or CPU).

Built in ``launcher/zero/distributed/accelerator.py``.
"""
from launcher.zero.distributed.accelerator import (  # noqa: F401
    Accelerator, get_accelerator, is_current_accelerator_supported, set_accelerator,
)

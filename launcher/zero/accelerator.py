"""``deepspeed.accelerator``: ``get_accelerator()``, the device a rank trains on (CUDA or CPU).

Built in ``launcher/zero/distributed/accelerator.py``.
"""
from launcher.zero.distributed.accelerator import Accelerator, get_accelerator, set_accelerator  # noqa: F401

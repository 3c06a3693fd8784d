"""``deepspeed.utils.init_on_device``: ``OnDevice``. Built in ``launcher/zero/distributed/on_device.py``."""
from launcher.zero.distributed.on_device import OnDevice  # noqa: F401

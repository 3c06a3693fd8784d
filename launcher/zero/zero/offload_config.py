"""``deepspeed.runtime.zero.offload_config``: ``OffloadDeviceEnum`` and ``OffloadStateTypeEnum``."""
from launcher.zero.config.offload_enums import OffloadDeviceEnum, OffloadStateTypeEnum  # noqa: F401

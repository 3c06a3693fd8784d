"""``deepspeed.runtime.zero.partition_parameters``: ``Init`` and ``GatheredParameters``."""
from launcher.zero.stages.stage3.init_context import GatheredParameters, Init  # noqa: F401

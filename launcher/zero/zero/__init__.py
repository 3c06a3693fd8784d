"""``deepspeed.zero`` (also ``deepspeed.runtime.zero``): what scripts reach as ``deepspeed.zero.<name>``."""
from launcher.zero.stages.stage3.init_context import (  # noqa: F401
    GatheredParameters, Init, register_external_parameter, unregister_external_parameter,
)

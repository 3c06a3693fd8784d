"""``deepspeed.zero`` (also ``deepspeed.runtime.zero``): what scripts reach as ``deepspeed.zero.<name>``."""
from launcher.zero.engine.generation import unwrap_model_for_generation  # noqa: F401
from launcher.zero.stages.stage3.init_context import (  # noqa: F401
    GatheredParameters, Init, register_external_parameter, unregister_external_parameter,
)
from launcher.zero.stages.stage3.params import ZeroParamStatus  # noqa: F401
from launcher.zero.stages.stage3.tiled_linear import TiledLinear, TiledLinearReturnBias  # noqa: F401

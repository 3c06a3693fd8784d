"""``deepspeed.runtime.zero.config``: ``ZeroStageEnum``, ``DeepSpeedZeroConfig`` (the checked
``zero_optimization`` section, this engine's ``ZeroOptimizationConfig``) and ``get_zero_config``."""
from launcher.zero.config.deepspeed_helpers import ZERO_OPTIMIZATION, ZeroStageEnum  # noqa: F401
from launcher.zero.config.load import get_zero_config  # noqa: F401
from launcher.zero.config.schema import ZeroOptimizationConfig as DeepSpeedZeroConfig  # noqa: F401

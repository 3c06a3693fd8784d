"""``deepspeed.runtime.engine``: ``DeepSpeedEngine`` is this engine's ``ZeroEngine``."""
from launcher.zero.engine.zero_engine import ZeroEngine as DeepSpeedEngine  # noqa: F401

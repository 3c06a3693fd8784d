"""``deepspeed.utils.logging``: the engine's ``logger`` and ``log_dist``."""
from launcher.zero.engine.log import log_dist, logger  # noqa: F401

"""``deepspeed.runtime.utils``: ``set_random_seed``."""
from launcher.zero.engine.seeding import set_random_seed  # noqa: F401

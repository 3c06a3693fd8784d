"""``deepspeed.utils.module_utils`` (also ``deepspeed.compression.helper``): submodules by dotted name."""
from launcher.zero.engine.module_paths import recursive_getattr, recursive_setattr  # noqa: F401

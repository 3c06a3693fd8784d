"""``deepspeed.moe``: Mixture of Experts is not built yet.

The package and its modules import (DeepSpeed's tutorials import ``deepspeed.moe.utils`` even when
they train without experts); building a layer or calling a helper raises ``NotSupportedError``.
"""
from launcher.zero.errors import NotSupportedError

FEATURE = "deepspeed.moe (Mixture of Experts)"
HINT = "run this script with DeepSpeed itself, or build the experts as plain modules (no expert parallelism)"


def not_built(name: str) -> NotSupportedError:
    """The error for using ``name`` of deepspeed.moe."""
    return NotSupportedError(f"{name}: {FEATURE} is not supported by dslaunch's engine yet", hint=HINT)

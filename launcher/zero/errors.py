"""The engine's typed errors: user mistakes carry a message naming the key or file, and a hint."""
from launcher.errors import ConfigError as _LauncherConfigError
from launcher.errors import EXIT_NON_FINITE, DslaunchError


class ConfigError(_LauncherConfigError):
    """A bad engine config; the message names the key (e.g. ``zero_optimization.stage``)."""


class CheckpointError(DslaunchError):
    """A checkpoint that cannot be found, read or matched to this model."""

    kind = "checkpoint error"


class LossScaleAtMinimumError(RuntimeError):
    """fp16 overflowed while the dynamic loss scale was already at ``min_loss_scale`` (DeepSpeed's rule)."""


class NonFiniteError(DslaunchError):
    """Training stopped on an inf/NaN loss or gradient; the message says where it first appeared."""

    kind = "non-finite training"
    exit_code = EXIT_NON_FINITE


class DistributedSetupError(DslaunchError):
    """The rank environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) is missing or inconsistent."""

    kind = "distributed setup error"


class NotSupportedError(DslaunchError, ImportError):
    """A DeepSpeed feature this engine does not have yet; an ImportError, so that a script's
    ``try: import deepspeed.moe ... except ImportError`` fallback still works."""

    kind = "not supported"

"""The engine's typed errors: user mistakes carry a message naming the key or file, and a hint."""
from launcher.errors import ConfigError as _LauncherConfigError
from launcher.errors import EXIT_NON_FINITE, DslaunchError


class ConfigError(_LauncherConfigError):
    """A bad engine config; the message names the key (e.g. ``zero_optimization.stage``)."""


class CheckpointError(DslaunchError):
    """A checkpoint that cannot be found, read or matched to this model."""

    kind = "checkpoint error"


class CheckpointDamagedError(CheckpointError):
    """A checkpoint file that is missing, truncated, or differs from the digest written at save;
    the message names the file and what is wrong."""

    kind = "damaged checkpoint"


class OptimizerStepError(DslaunchError, RuntimeError):
    """The optimizer ``initialize`` returned was used in a way that cannot step: a second step on
    gradients it already applied, a closure, another run's state."""

    kind = "optimizer step error"


class CheckpointPathError(CheckpointError, ValueError, TypeError):
    """``save_checkpoint`` / ``load_checkpoint`` without a folder (``""`` or None). DeepSpeed 0.19.8
    raises ValueError for a save and TypeError for ``load_checkpoint(None)``; this is both, so a
    script's ``except`` written against either still catches it."""


class NvmeOffloadError(DslaunchError, OSError):
    """NVMe offload's files could not be read or written mid-run (folder removed, disk full, I/O
    error); the message names the file. An OSError too, so a script's ``except OSError`` catches it."""

    kind = "NVMe offload error"


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


class NotBuiltConfigError(ConfigError, NotSupportedError):
    """A DeepSpeed config key set to turn on a feature this engine does not build (config/not_built.py):
    a config error (exit 2, one message for the job) naming the key and what to use instead."""


class EngineUsageError(DslaunchError, AssertionError):
    """A call DeepSpeed refuses with an ``assert`` (``engine.step()`` inside ``no_sync``, ``backward``
    on an engine built without an optimizer): typed, with a hint, and an AssertionError too, so a
    script's ``except`` written against DeepSpeed still catches it."""

    kind = "usage error"   # "dslaunch: usage error: engine.step(): ..." from the rank (failure.py)


class _NotBuiltMeta(type):
    """Reading a DeepSpeed class attribute of a stand-in (``X.register_with_transformers``) also says not supported."""

    def __getattr__(cls, attribute: str):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise cls._error()


def not_built(name: str, feature: str, hint: str = "run this script with DeepSpeed itself") -> type:
    """A stand-in for a DeepSpeed class or function this engine does not have.

    Importing it works; calling it (building the class, calling the function) or reading one of
    its attributes raises NotSupportedError naming ``feature``: a script fails where it uses the
    feature, not where it imports it.
    """
    def _error(cls=None) -> NotSupportedError:
        return NotSupportedError(f"{name}: {feature} is not supported by dslaunch's engine", hint=hint)

    def __init__(self, *args, **kwargs):
        raise _error()

    short = name.rsplit(".", 1)[-1]
    return _NotBuiltMeta(short, (), {"__init__": __init__, "_error": staticmethod(_error), "__qualname__": short,
                                     "__doc__": f"Not built in dslaunch's engine: {feature}."})

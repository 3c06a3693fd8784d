"""``deepspeed.runtime``: the modules scripts import by path (``utils``, ``lr_schedules``, ``engine``,
``base_optimizer``)."""
import importlib as _importlib


def __getattr__(name: str):
    """``deepspeed.<package>.<module>`` after only ``import deepspeed``: import it on first use."""
    try:
        return _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'") from None

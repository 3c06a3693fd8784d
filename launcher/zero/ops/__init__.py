"""``deepspeed.ops``: the optimizers scripts build by hand (``ops.adam``, ``ops.lamb``) and ``ops.sparse_attention``."""
import importlib as _importlib


def __getattr__(name: str):
    """``deepspeed.<package>.<module>`` after only ``import deepspeed``: import it on first use."""
    try:
        return _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'") from None

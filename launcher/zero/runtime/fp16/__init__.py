"""``deepspeed.runtime.fp16``: DeepSpeed's loss scalers (``loss_scaler``) and the types of its 16-bit
optimizer wrappers (``fused_optimizer``, ``unfused_optimizer``)."""
import importlib as _importlib


def __getattr__(name: str):
    """``deepspeed.runtime.fp16.loss_scaler`` after only ``import deepspeed``: import it on first use."""
    try:
        return _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'") from None

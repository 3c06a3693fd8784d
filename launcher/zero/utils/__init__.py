"""``deepspeed.utils``: ``RepeatingLoader``, ``logger``, ``log_dist``, ``OnDevice``, the tensor-fragment
family (``safe_get_full_fp32_param`` ...), ZeRO-3 leaf modules (``set_z3_leaf_modules`` ...);
``utils.zero_to_fp32`` and others below."""
from launcher.zero.data.loader import RepeatingLoader  # noqa: F401
from launcher.zero.distributed.on_device import OnDevice  # noqa: F401
from launcher.zero.engine.fragment_access import (  # noqa: F401
    safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state, safe_get_local_fp32_param,
    safe_get_local_grad, safe_get_local_optimizer_state, safe_set_full_fp32_param, safe_set_full_grad,
    safe_set_full_optimizer_state, safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
    safe_update_full_grad_vectorized,
)
from launcher.zero.engine.log import log_dist, logger  # noqa: F401
from launcher.zero.stages.stage3.leaf_modules import (  # noqa: F401
    get_z3_leaf_modules, set_z3_leaf_module, set_z3_leaf_modules, set_z3_leaf_modules_by_name,
    set_z3_leaf_modules_by_suffix, unset_z3_leaf_modules, z3_leaf_module, z3_leaf_parameter,
)


def __getattr__(name: str):
    """``deepspeed.utils.zero_to_fp32`` after only ``import deepspeed``: import it on first use."""
    import importlib

    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'") from None

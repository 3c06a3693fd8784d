"""``deepspeed.utils.tensor_fragment``: one parameter's fp32 master, optimizer state or gradient, whole
or this rank's part (built in ``launcher/zero/engine/fragment_access.py``)."""
from launcher.zero.engine.fragment_access import (  # noqa: F401
    safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state, safe_get_local_fp32_param,
    safe_get_local_grad, safe_get_local_optimizer_state, safe_set_full_fp32_param, safe_set_full_grad,
    safe_set_full_optimizer_state, safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
    safe_update_full_grad_vectorized,
)

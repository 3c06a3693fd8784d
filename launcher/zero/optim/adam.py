"""DeepSpeed's optimizer signatures (``deepspeed.ops.adam``): ``FusedAdam``, ``DeepSpeedCPUAdam``."""
from __future__ import annotations

import torch

from launcher.zero.optim.cpu_adam import CPUAdam
from launcher.zero.optim.factory import all_on_cuda, materialize_params


def FusedAdam(params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999), eps: float = 1e-8,  # noqa: N802
              adam_w_mode: bool = True, weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True):
    """torch's AdamW (``adam_w_mode``, the default) or Adam, fused on the GPU, DeepSpeed's defaults."""
    if not bias_correction:
        raise ValueError("FusedAdam: bias_correction=False is not supported")
    params = materialize_params(params)
    cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    return cls(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
               fused=all_on_cuda(params) or None)


class DeepSpeedCPUAdam(CPUAdam):
    """DeepSpeed's CPU Adam signature over this engine's multi-threaded CPU Adam."""

    def __init__(self, model_params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, adamw_mode: bool = True,
                 fp32_optimizer_states: bool = True):
        if amsgrad:
            raise ValueError("DeepSpeedCPUAdam: amsgrad is not supported")
        super().__init__(model_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         adamw_mode=adamw_mode, bias_correction=bias_correction,
                         fp32_optimizer_states=fp32_optimizer_states)

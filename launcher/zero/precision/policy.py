"""Which dtype each tensor role uses: parameters, gradient accumulation, communication, masters."""
from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class PrecisionPolicy:
    """The dtypes of one run (DeepSpeed 0.19.8's fp16 / bf16 / data_types sections)."""

    param_dtype: torch.dtype        # model weights and activations
    grad_accum_dtype: torch.dtype   # where micro-step gradients add up
    comm_dtype: torch.dtype         # gradients on the wire
    master_dtype: torch.dtype       # what the optimizer steps

    @property
    def mixed(self) -> bool:
        """True when the masters are a separate copy of the weights."""
        return self.param_dtype != self.master_dtype


def precision_policy(config) -> PrecisionPolicy:
    """The policy for a ZeroConfig: fp16 / bf16 with fp32 masters (16-bit masters with
    ``fp16_master_weights_and_grads`` / ``bf16_master_weights_and_grads``), or fp32 throughout."""
    if config.fp16.enabled:
        param = torch.float16
        master = torch.float16 if config.fp16.fp16_master_weights_and_grads else torch.float32
    elif config.bf16.enabled:
        param = torch.bfloat16
        master = torch.bfloat16 if config.bf16.bf16_master_weights_and_grads else torch.float32
    else:
        param, master = torch.float32, torch.float32
    accum = DTYPES[config.data_types.grad_accum_dtype] if config.data_types.grad_accum_dtype else param
    comm = DTYPES[config.communication_data_type] if config.communication_data_type else param
    return PrecisionPolicy(param_dtype=param, grad_accum_dtype=accum, comm_dtype=comm, master_dtype=master)


def skips_non_finite(param_dtype: torch.dtype, config) -> bool:
    """The one rule for skipping an optimizer step, in both engines: an inf/NaN gradient skips it,
    except in bf16 without ``bf16.check_grad_overflow`` (DeepSpeed's default), where the step runs
    and an infinite norm's clip factor zeroes the gradients."""
    return param_dtype != torch.bfloat16 or bool(config.bf16.check_grad_overflow)

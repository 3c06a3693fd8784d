"""DeepSpeed's offload enums, for scripts that name offload devices and states in code."""
from __future__ import annotations

import enum


class OffloadDeviceEnum(str, enum.Enum):
    """Where ``offload_optimizer`` / ``offload_param`` put tensors (the config's ``device``)."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, enum.Enum):
    """The kinds of state DeepSpeed's ``engine.offload_states`` can move."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"

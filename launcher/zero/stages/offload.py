"""ZeRO-Offload at stages 1 and 2: fp32 masters and optimizer state in host memory.

The device keeps the model-dtype weights and this rank's gradient partition (stage 2) or the
whole gradients (stage 1), exactly as without offload. At the boundary the owned gradient slice
is copied into a (pinned) host buffer, the optimizer (our CPUAdam when the config asks for Adam)
steps the host masters, and the updated slice is copied back and all-gathered. Stage 3's
offload lives in the stage-3 strategy itself.
"""
from __future__ import annotations

import torch

from launcher.zero.layout.flat import ParamGroup
from launcher.zero.stages.stage1 import Stage1Strategy
from launcher.zero.stages.stage2 import Stage2Strategy


def host_copy(source: torch.Tensor, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A host tensor holding ``source`` as ``dtype``; page-locked when asked and a GPU exists."""
    pin = pin and torch.cuda.is_available()
    out = torch.empty(source.numel(), dtype=dtype, pin_memory=pin)
    out.copy_(source.detach().reshape(-1))
    return out


class _HostMasters:
    """Mixin over a partitioned stage: masters and master grads on the CPU."""

    def _pin(self) -> bool:
        offload = self.context.config.zero_optimization.offload_optimizer
        return bool(offload is not None and offload.pin_memory)

    def build_master(self, group: ParamGroup) -> torch.Tensor:
        buffer = self.param_buffers[self.group_position(group.index)]
        low, high = self.partition_bounds(group)
        self.aliased = False   # the device weights and the host masters are always two tensors
        return host_copy(buffer[low:high], self.context.precision.master_dtype, self._pin())

    def _host_grad(self, position: int, master: torch.Tensor) -> torch.Tensor:
        grads = getattr(self, "_host_grads", None)
        if grads is None:
            grads = self._host_grads = {}
        if position not in grads:
            grads[position] = host_copy(torch.zeros(master.numel()), master.dtype, self._pin())
        return grads[position]

    def _owned_grads(self) -> list[torch.Tensor]:  # pragma: no cover - per stage
        raise NotImplementedError

    def prepare_master_grads(self) -> None:
        for position, (master, owned) in enumerate(zip(self.masters, self._owned_grads())):
            host = self._host_grad(position, master)
            host.copy_(owned, non_blocking=True)
            master.grad = host
        if torch.cuda.is_available() and self.context.dist.device.type == "cuda":
            torch.cuda.current_stream().synchronize()   # the step reads the host copies

    def zero_grad(self) -> None:
        super().zero_grad()
        for host in getattr(self, "_host_grads", {}).values():
            host.zero_()

    def memory_breakdown(self) -> dict[str, int]:
        parts = super().memory_breakdown()
        parts["master_weights"] = sum(m.numel() * m.element_size() for m in self.masters)
        return parts


class Stage1OffloadStrategy(_HostMasters, Stage1Strategy):
    """Stage 1 with ``offload_optimizer``."""

    def _owned_grads(self) -> list[torch.Tensor]:
        owned = []
        for group, grads in zip(self.groups, self.grad_buffers):
            low, high = self.partition_bounds(group)
            owned.append(grads.buffer[low:high])
        return owned


class Stage2OffloadStrategy(_HostMasters, Stage2Strategy):
    """Stage 2 with ``offload_optimizer``."""

    def _owned_grads(self) -> list[torch.Tensor]:
        return list(self.grad_partitions)


def OffloadStrategy(context):  # noqa: N802 - the registry's name for "stage 1 or 2 with offload"
    """The offload strategy for the configured stage (the registry maps both stages here)."""
    stage = context.config.zero_stage
    return (Stage1OffloadStrategy if stage == 1 else Stage2OffloadStrategy)(context)

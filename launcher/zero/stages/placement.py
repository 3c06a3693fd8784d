"""Optimizer placement of stages 1-2: where the master tensors and their gradients live.

``OnDevice``: masters next to the weights (or the weights themselves when the partitioning
allows aliasing). ``OnHost`` (ZeRO-Offload): fp32 masters and the optimizer state in (pinned)
host memory; the owned gradient slice is copied to the host for the step, and the updated
master is copied back by the strategy's write-back. Stage 3's offload lives in stage 3 itself.
"""
from __future__ import annotations

import torch


def host_copy(source: torch.Tensor, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A host tensor holding ``source`` as ``dtype``; page-locked when asked and a GPU exists."""
    pin = pin and torch.cuda.is_available()
    out = torch.empty(source.numel(), dtype=dtype, pin_memory=pin)
    out.copy_(source.detach().reshape(-1))
    return out


class OnDevice:
    """Masters on the training device."""

    def __init__(self, context):
        self.context = context

    def build(self, weights: torch.Tensor, may_alias: bool) -> tuple[torch.Tensor, bool]:
        """The master for the weight range ``weights``, and whether it *is* that range."""
        if may_alias:
            return weights, True
        return weights.detach().to(self.context.precision.master_dtype).clone(), False

    def give_grads(self, masters: list[torch.Tensor], owned: list[torch.Tensor]) -> None:
        """Each master's ``.grad``: its owned gradient range (an fp32 copy when the dtypes differ)."""
        for master, grad in zip(masters, owned):
            master.grad = grad if grad.dtype == master.dtype else grad.to(master.dtype)

    def clear_grads(self, masters: list[torch.Tensor]) -> None:
        for master in masters:
            master.grad = None


class OnHost(OnDevice):
    """Masters and master grads in host memory, page-locked when the config asks for it."""

    def __init__(self, context):
        super().__init__(context)
        offload = context.config.zero_optimization.offload_optimizer
        self.pin = bool(offload is not None and offload.pin_memory)
        self.host_grads: list[torch.Tensor] = []

    def build(self, weights: torch.Tensor, may_alias: bool) -> tuple[torch.Tensor, bool]:
        master = host_copy(weights, self.context.precision.master_dtype, self.pin)
        self.host_grads.append(host_copy(torch.zeros(master.numel()), master.dtype, self.pin))
        return master, False   # the device weights and the host masters are always two tensors

    def give_grads(self, masters: list[torch.Tensor], owned: list[torch.Tensor]) -> None:
        for master, grad, host in zip(masters, owned, self.host_grads):
            host.copy_(grad, non_blocking=True)
            master.grad = host
        if torch.cuda.is_available() and self.context.dist.device.type == "cuda":
            torch.cuda.current_stream().synchronize()   # the step reads the host copies

    def clear_grads(self, masters: list[torch.Tensor]) -> None:
        super().clear_grads(masters)
        for host in self.host_grads:
            host.zero_()

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

    def norm_grads(self, masters: list[torch.Tensor]) -> list[torch.Tensor]:
        return [master.grad for master in masters]

    def scale_grads(self, masters: list[torch.Tensor], factor: float) -> None:
        if factor != 1.0:
            for master in masters:
                if master.grad is not None:
                    master.grad.mul_(factor)

    def copy_targets(self, masters: list[torch.Tensor]) -> dict:
        return {}

    def write_back(self, target: torch.Tensor, master: torch.Tensor, position: int, wrote_copies: bool) -> None:
        target.copy_(master)

    def clear_grads(self, masters: list[torch.Tensor]) -> None:
        for master in masters:
            master.grad = None


class OnHost(OnDevice):
    """Masters and master grads in host memory, page-locked when the config asks for it.

    Per step the device does what is cheap there: the norm and the overflow check read the
    device gradients (``norm_grads``), and unscaling, clipping and the cast to fp32 happen on
    the device before one copy per group into the pinned host gradient (``scale_grads``). A
    CPU Adam writes each updated chunk also into a pinned host copy in the weights' dtype
    (``copy_targets``), so the copy back moves 16-bit values with no host-side cast.
    """

    STAGE_NUMEL = 1 << 25   # fp32 staging on the device, 128 MiB at a time

    def __init__(self, context):
        super().__init__(context)
        offload = context.config.zero_optimization.offload_optimizer
        self.pin = bool(offload is not None and offload.pin_memory)
        self.host_grads: list[torch.Tensor] = []
        self.host_weights: list[torch.Tensor] = []
        self.owned: list[torch.Tensor] = []

    def build(self, weights: torch.Tensor, may_alias: bool) -> tuple[torch.Tensor, bool]:
        master = host_copy(weights, self.context.precision.master_dtype, self.pin)
        self.host_grads.append(host_copy(torch.zeros(master.numel()), master.dtype, self.pin))
        if weights.dtype != master.dtype:
            self.host_weights.append(host_copy(weights, weights.dtype, self.pin))
        return master, False   # the device weights and the host masters are always two tensors

    def give_grads(self, masters: list[torch.Tensor], owned: list[torch.Tensor]) -> None:
        """The host grads are filled in ``scale_grads``, once the step is known to happen."""
        self.owned = owned
        for master, host in zip(masters, self.host_grads):
            master.grad = host

    def norm_grads(self, masters: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(self.owned)

    def scale_grads(self, masters: list[torch.Tensor], factor: float) -> None:
        """Unscale/clip and cast on the device, then one pinned copy per staging chunk; wait once."""
        for grad, host in zip(self.owned, self.host_grads):
            for start in range(0, grad.numel(), self.STAGE_NUMEL):
                piece = grad[start:start + self.STAGE_NUMEL]
                if piece.dtype != host.dtype or factor != 1.0:
                    piece = piece.to(host.dtype).mul_(factor) if factor != 1.0 else piece.to(host.dtype)
                host[start:start + piece.numel()].copy_(piece, non_blocking=True)
        if torch.cuda.is_available() and self.context.dist.device.type == "cuda":
            torch.cuda.current_stream().synchronize()   # the step reads the host copies

    def copy_targets(self, masters: list[torch.Tensor]) -> dict:
        """Where a CPU Adam also writes each updated master (the 16-bit copies), if the dtypes differ."""
        return dict(zip(masters, self.host_weights)) if self.host_weights else {}

    def write_back(self, target: torch.Tensor, master: torch.Tensor, position: int, wrote_copies: bool) -> None:
        """Updated master -> device weights: the 16-bit host copy when the optimizer wrote it."""
        source = self.host_weights[position] if wrote_copies and self.host_weights else master
        if source.dtype == target.dtype or target.device.type == "cpu":
            target.copy_(source, non_blocking=True)
            return
        for start in range(0, source.numel(), self.STAGE_NUMEL):   # cast on the device, not the host
            piece = source[start:start + self.STAGE_NUMEL].to(target.device, non_blocking=True)
            target[start:start + piece.numel()].copy_(piece)

    def clear_grads(self, masters: list[torch.Tensor]) -> None:
        super().clear_grads(masters)
        self.owned = []

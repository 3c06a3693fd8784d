"""Which module went non-finite, seen during the step it happened in (not by a re-run).

A forward hook on every module reduces each floating output to one number on the device (its sum,
which is inf/NaN exactly when an element is, barring an fp32 overflow of the sum) and hangs a
tensor hook on the output that does the same to its gradient in the backward. Nothing is read on
the host while training is healthy: the numbers are read only at a step the engine already found
non-finite (its loss or gradient norm), so the cost is the device-side reductions.

What a reduction reads: a module at or above the model's repeated blocks (a transformer's layers,
the embeddings, the head) is read whole; a module inside a block is read at one element per row
(the first of its last dimension). An inf or NaN entering a Linear or a LayerNorm fills the whole
row it lands in, so one element per row catches what came in; an inf born in one element further
along a row is caught by the next module or by its block's full read. That keeps the cost near one
read of the residual stream per block and direction.

Order is the order the hooks fire: forward order for outputs, backward order for gradients.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from launcher.zero.engine.compiling import repeated_blocks
from launcher.zero.engine.plain_backward import tensors_in


@dataclass
class MicroBatch:
    """One micro-batch's reductions, in the order their hooks fired."""

    forward: list = field(default_factory=list)     # (module name, type name, 0-dim device tensor)
    backward: list = field(default_factory=list)


@dataclass(frozen=True)
class TraceFinding:
    """Where one rank first went non-finite. Forward: the first module whose output did. Backward: the
    module in whose backward it arose (its output gradient was finite, the next one checked in
    backward order, ``after``'s output gradient, was not); ``after`` None: the first gradient checked,
    of ``module``'s output, was non-finite already."""

    phase: str            # "forward" or "backward"
    micro_batch: int      # 0-based within the step
    micro_batches: int    # how many the step had
    module: str           # dotted name; "" is the model itself
    module_type: str
    after: str | None = None


class NanTrace:
    """Hooks on every module of ``module``; ``finding()`` reads them once a step went non-finite."""

    def __init__(self, module: torch.nn.Module):
        inside = {id(m) for block in repeated_blocks(module) for m in block.modules() if m is not block}
        self._micro_batches: list[MicroBatch] = []
        self._last = None                 # the last tensor reduced (a parent returning its child's output)
        self.error: str | None = None     # the trace's own failure, said once by the instruments
        self._handles = [m.register_forward_hook(self._hook(name, type(m).__name__, id(m) not in inside))
                         for name, m in module.named_modules()]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.reset()

    def forward_begins(self) -> None:
        """A new micro-batch (a forward without gradients, an evaluation, is not traced)."""
        if self._handles and torch.is_grad_enabled():
            self._micro_batches.append(MicroBatch())

    def reset(self) -> None:
        """The step is over: its reductions are dropped unread."""
        self._micro_batches, self._last = [], None

    def _hook(self, name: str, kind: str, whole: bool):
        def after_forward(_module, _inputs, output):
            if not self._micro_batches or self.error is not None or not torch.is_grad_enabled():
                return
            try:
                self._record(self._micro_batches[-1], name, kind, whole, output)
            except Exception as error:   # a watcher never fails the step
                self.error = f"{type(error).__name__}: {error}"
        return after_forward

    def _record(self, micro: MicroBatch, name: str, kind: str, whole: bool, output) -> None:
        for tensor in tensors_in(output):
            if not tensor.is_floating_point() or not tensor.numel() or tensor is self._last:
                continue
            self._last = tensor
            micro.forward.append((name, kind, _reduce(tensor.detach(), whole)))
            if tensor.requires_grad:
                tensor.register_hook(self._gradient_hook(micro, name, kind, whole))
            return   # a module's first floating output stands for it

    def _gradient_hook(self, micro: MicroBatch, name: str, kind: str, whole: bool):
        def after_gradient(grad):
            if self.error is None:
                try:
                    micro.backward.append((name, kind, _reduce(grad.detach(), whole)))
                except Exception as error:
                    self.error = f"{type(error).__name__}: {error}"
        return after_gradient

    def finding(self) -> TraceFinding | None:
        """The first non-finite output (or else gradient) of the earliest such micro-batch; a host read."""
        for index, micro in enumerate(self._micro_batches):
            for phase, entries in (("forward", micro.forward), ("backward", micro.backward)):
                first = _first_non_finite(entries)
                if first is None:
                    continue
                if phase == "backward" and first > 0:   # it arose in the backward of the one before
                    return TraceFinding(phase, index, len(self._micro_batches), *entries[first - 1][:2],
                                        after=entries[first][0])
                return TraceFinding(phase, index, len(self._micro_batches), *entries[first][:2])
        return None


def _reduce(tensor: torch.Tensor, whole: bool) -> torch.Tensor:
    """One number that is inf/NaN when the (sampled) tensor holds one: a single read, no host sync."""
    if not whole and tensor.dim() >= 2:
        tensor = tensor[..., :1]
    return tensor.sum(dtype=torch.float32)


def _first_non_finite(entries: list) -> int | None:
    if not entries:
        return None
    finite = torch.isfinite(torch.stack([value for _, _, value in entries])).tolist()
    return next((i for i, ok in enumerate(finite) if not ok), None)

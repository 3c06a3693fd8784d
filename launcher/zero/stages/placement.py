"""Optimizer placement of stages 1-2: where the master tensors and their gradients live.

``OnDevice``: masters next to the weights (or the weights themselves when the partitioning
allows aliasing). ``OnHost`` (ZeRO-Offload): fp32 masters and the optimizer state in (pinned)
host memory; the owned gradient slice is copied to the host for the step, and the updated
master is copied back by the strategy's write-back. Stage 3's offload lives in stage 3 itself.
"""
from __future__ import annotations

import torch

from launcher.zero.stages.base import squares_of
from launcher.zero.stages.host_memory import host_zeros


def host_copy(source: torch.Tensor, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A host tensor holding ``source`` as ``dtype``; page-locked when asked and a GPU exists,
    at its exact size (host_memory.py)."""
    out = host_zeros(source.numel(), dtype, pin)
    out.copy_(source.detach().reshape(-1))
    return out


STAGE_NUMEL = 1 << 25   # host <-> device copies go in pieces of at most 128 MiB of fp32


def copy_in_pieces(target: torch.Tensor, source: torch.Tensor, piece_numel: int = STAGE_NUMEL) -> None:
    """``target[:] = source`` between host and device, asynchronously, ``piece_numel`` values at a
    time (the temporaries stay small); a dtype change happens on the device side of the copy, since
    a cast on the host would cost the host a pass of its own."""
    for low in range(0, source.numel(), piece_numel):
        piece = source[low:low + piece_numel]
        if piece.dtype != target.dtype:
            piece = piece.to(target.dtype) if piece.device.type != "cpu" else piece.to(target.device, non_blocking=True)
        target[low:low + piece.numel()].copy_(piece, non_blocking=True)


def cast_divided(grad: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """``grad`` as ``dtype`` divided by ``scale``, in one pass (read 16 bits, write 32 an element).
    ``scale`` goes in as a 1-element tensor, not a 0-dim one: a 0-dim float32 tensor would leave
    the result in bf16 (type promotion), a 1-element one makes it float32, so each value is the
    exact cast divided once in float32, what the fused Adam's ``grad_scale`` gives the cast grads."""
    out = torch.empty(grad.shape, dtype=dtype, device=grad.device)
    if scale is None:
        return out.copy_(grad)
    return torch.div(grad, scale.reshape(1), out=out)


class OnDevice:
    """Masters on the training device."""

    def __init__(self, context):
        self.context = context
        self.uncast: list[torch.Tensor] = []   # owned grads whose cast waits for cast_grads

    def build(self, weights: torch.Tensor, may_alias: bool, on_device: bool = False) -> tuple[torch.Tensor, bool]:
        """The master for the weight range ``weights``, and whether it *is* that range (``on_device``:
        offload's kept part, offload_optimizer.ratio; here every master is on the device)."""
        if may_alias:
            return weights, True
        return weights.detach().to(self.context.precision.master_dtype).clone(), False

    def give_grads(self, masters: list[torch.Tensor], owned: list[torch.Tensor],
                   whole: list[torch.Tensor] | None = None, defer_cast: bool = False) -> None:
        """Each master's ``.grad``: its owned gradient range (an fp32 copy when the dtypes differ;
        with ``defer_cast`` that copy waits for ``cast_grads``, and the norm reads ``owned``);
        ``whole``: the groups' owned ranges uncut, where offload measures the norm."""
        self.uncast = []
        if defer_cast and all(grad.dtype != master.dtype for master, grad in zip(masters, owned)):
            self.uncast = list(owned)
            return
        for master, grad in zip(masters, owned):
            master.grad = grad if grad.dtype == master.dtype else grad.to(master.dtype)

    def cast_grads(self, masters: list[torch.Tensor], scale: torch.Tensor | None) -> bool:
        """The deferred casts, divided by ``scale`` as they are made (see ``cast_divided``)."""
        uncast, self.uncast = self.uncast, []
        for master, grad in zip(masters, uncast):
            master.grad = cast_divided(grad, master.dtype, scale)
        return bool(uncast)

    def norm_grads(self, masters: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(self.uncast) if self.uncast else [master.grad for master in masters]

    def takes_factor(self, factor: float) -> bool:
        """Whether the optimizer applies the step's unscale/clip factor itself (else the grads are scaled)."""
        return False

    def take_square_sum(self) -> torch.Tensor | None:
        """The gradients' square sum if ``give_grads`` already measured it (once), else None."""
        return None

    def bucket_numel(self, configured: int) -> int:
        """The gradient bucket size to use (``reduce_bucket_size`` unless the placement needs less)."""
        return configured

    def grad_ready(self, position: int, offset: int, grad: torch.Tensor) -> None:
        """An owned gradient range is final for this step (offload starts its copy here)."""

    def attach(self, optimizer, masters: list[torch.Tensor], targets: list[torch.Tensor], expected: list[int]) -> None:
        """Bind to the optimizer and the device weight ranges (nothing to do on the device)."""

    def write_back(self, target: torch.Tensor, master: torch.Tensor, position: int) -> None:
        target.copy_(master)

    def host_gradient_bytes(self) -> int | None:
        """Bytes of the gradient buffers this placement keeps in host memory; None: it keeps none."""
        return None

    def clear_grads(self, masters: list[torch.Tensor], stepping: bool = False) -> None:
        """Drop the master grads; ``stepping``: a background step still reads them (overlap_step)."""
        self.uncast = []
        for master in masters:
            master.grad = None


class OnHost(OnDevice):
    """Masters and master grads in host memory, page-locked when the config asks for it.

    The step is a pipeline with as little host work as the arithmetic allows:

    * during the boundary's backward each owned gradient range is copied to the pinned host
      gradient on a side stream as soon as its reduction is final (``grad_ready``), in fp32,
      cast on the device; ranges that never reported are copied at the step (``give_grads``);
    * the norm and the overflow check read the device gradients (``norm_grads``);
    * unscaling and clipping are one factor that our CPU Adam applies as it reads each gradient
      (``grad_factor``); another optimizer gets its host grads multiplied first;
    * the updated fp32 masters go back chunk by chunk while later chunks are still being
      updated (our CPU Adam reports each chunk, ``on_chunk``), and are cast on the device: a
      host-side cast to 16 bits would cost the host a pass of its own (measured: 50 ms of the
      406M model's 157 ms step), twice the PCIe bytes cost nothing while the Adam runs.

    With ``overlap_step`` the Adam and the uploads run in the background (step_overlap.py):
    each upload publishes its mark, and the host gradients are two buffers used in turn, so
    the next backward's copies never land in the buffer the running step reads.

    ``offload_optimizer.ratio`` below 1: the positions built ``on_device`` (``kept``) keep an fp32
    master on the device and nothing on the host; their gradient is the reduced one itself (a
    copy of it with overlap_step, since the next backward reuses that buffer), our CPU Adam
    steps them there, and their "upload" is the device copy into the weights.
    """

    UPLOAD_NUMEL = 1 << 24    # copy updated weights back in runs of at least this many values

    def __init__(self, context):
        super().__init__(context)
        offload = context.config.zero_optimization.offload_optimizer
        self.pin = bool(offload is not None and offload.pin_memory)
        cuda = context.dist_context.device.type == "cuda" and torch.cuda.is_available()
        self.stream = torch.cuda.Stream(device=context.dist_context.device) if cuda else None
        self.host_grads: list[torch.Tensor] = []
        self.owned: list[torch.Tensor] = []
        self.filled: list[int] = []
        self.overlap = None          # a StepOverlap, set by the strategy when overlap_step is on
        self.double_buffer = bool(offload is not None and offload.overlap_step)
        self.spare_grads: list[torch.Tensor] = []
        self.measured: torch.Tensor | None = None   # the square sum give_grads measured
        self.kept: list[bool] = []   # per position: master and states stay on the device (ratio)

    def build(self, weights: torch.Tensor, may_alias: bool, on_device: bool = False) -> tuple[torch.Tensor, bool]:
        self.kept.append(on_device)
        self.filled.append(0)
        dtype = self.context.precision.master_dtype
        if on_device:   # nothing on the host; an empty entry keeps the lists by position
            for buffers in (self.host_grads, self.spare_grads) if self.double_buffer else (self.host_grads,):
                buffers.append(torch.empty(0, dtype=dtype))
            return weights.detach().to(dtype, copy=True), False
        master = host_copy(weights, dtype, self.pin)
        self.host_grads.append(host_zeros(master.numel(), master.dtype, self.pin))
        if self.double_buffer:
            self.spare_grads.append(host_zeros(master.numel(), master.dtype, self.pin))
        return master, False   # the device weights and the host masters are always two tensors

    def host_gradient_bytes(self) -> int:
        """The host gradient buffers (two with overlap_step), in the masters' dtype."""
        return sum(g.numel() * g.element_size() for g in self.host_grads + self.spare_grads)

    # ---- gradients to the host -------------------------------------------------------------
    def bucket_numel(self, configured: int) -> int:
        """At most STAGE_NUMEL: a bucket's copy to the host starts when the bucket is reduced, so
        one bucket of the whole model (DeepSpeed's default 5e8) would copy only after backward."""
        return min(configured, STAGE_NUMEL)

    def grad_ready(self, position: int, offset: int, grad: torch.Tensor) -> None:
        """The owned gradient range at ``offset`` is final for this step: start its copy."""
        if self.kept[position]:   # stays where it is: give_grads hands it over
            return
        host = self.host_grads[position][offset:offset + grad.numel()]
        self.filled[position] += grad.numel()
        if self.stream is None:
            host.copy_(grad)
            return
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            host.copy_(grad if grad.dtype == host.dtype else grad.to(host.dtype), non_blocking=True)

    def give_grads(self, masters: list[torch.Tensor], owned: list[torch.Tensor],
                   whole: list[torch.Tensor] | None = None, defer_cast: bool = False) -> None:
        """The host grads: the reported ranges were copied while backward ran; copy any range
        that did not report, and wait, so that whatever reads ``master.grad`` sees it whole.
        The norm is measured over ``whole`` (each group's range uncut): the same sums in the
        same rows whatever offload_optimizer.ratio cuts off."""
        self.owned = owned
        for position, (master, grad, host) in enumerate(zip(masters, owned, self.host_grads)):
            if self.kept[position]:   # a background step reads it while the next backward reduces
                master.grad = grad.to(master.dtype, copy=self.double_buffer)
                continue
            if self.filled[position] != self.expected[position]:
                self._copy_whole(grad, host)
            master.grad = host
        # the norm's kernels queue behind the backward now, beside the last copies to the host
        self.measured = squares_of(owned if whole is None else whole, self.context.dist_context.device)
        self._wait()

    def take_square_sum(self) -> torch.Tensor | None:
        measured, self.measured = self.measured, None
        return measured

    def norm_grads(self, masters: list[torch.Tensor]) -> list[torch.Tensor]:
        return list(self.owned)

    def takes_factor(self, factor: float) -> bool:
        """Unscaling and clipping: our CPU Adam applies the factor as it reads each gradient."""
        if self.optimizer_scales:
            self.optimizer.grad_factor = factor
        return self.optimizer_scales

    def _copy_whole(self, grad: torch.Tensor, host: torch.Tensor) -> None:
        copy_in_pieces(host, grad)

    def _wait(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
            torch.cuda.current_stream().synchronize()   # the step reads the host copies

    # ---- updated weights back to the device --------------------------------------------------
    def attach(self, optimizer, masters: list[torch.Tensor], targets: list[torch.Tensor], expected: list[int]) -> None:
        """Bind to the optimizer and the device weight ranges the masters go back into."""
        self.optimizer, self.expected, self.targets = optimizer, expected, targets
        self.optimizer_scales = hasattr(optimizer, "grad_factor")
        if hasattr(optimizer, "on_chunk"):
            optimizer.on_chunk = self._chunk_written
        self.masters = masters
        self.position_of = {id(m): i for i, m in enumerate(masters)}
        self.uploaded = [0] * len(masters)

    def _chunk_written(self, master: torch.Tensor, start: int, end: int) -> None:
        """Called in order by the CPU Adam: upload the written prefix in runs of UPLOAD_NUMEL."""
        position = self.position_of[id(master)]
        done = self.uploaded[position]
        if end - done >= self.UPLOAD_NUMEL or end == master.numel():
            self._upload(position, done, end)

    def _upload(self, position: int, start: int, end: int) -> None:
        """master[start:end] -> device weights, on the side stream, cast there."""
        source, target = self.masters[position][start:end], self.targets[position][start:end]
        self.uploaded[position] = end
        if self.kept[position]:   # on the device already: a copy on the stream its update ran on
            target.copy_(source)
            if self.overlap is not None:
                self.overlap.publish(position, end, torch.cuda.current_stream() if self.stream is not None else None)
            return
        if self.stream is None:
            target.copy_(source)
        else:
            with torch.cuda.stream(self.stream):
                copy_in_pieces(target, source)
        if self.overlap is not None:
            self.overlap.publish(position, end, self.stream)

    def write_back(self, target: torch.Tensor, master: torch.Tensor, position: int) -> None:
        """Updated master -> device weights: what the step's uploads did not cover, then wait for them."""
        if self.uploaded[position] < master.numel():
            self._upload(position, self.uploaded[position], master.numel())
        self.uploaded[position] = 0
        if self.stream is not None and not (self.overlap is not None and self.overlap.in_worker):
            torch.cuda.current_stream().wait_stream(self.stream)   # in the background: each module waits

    def clear_grads(self, masters: list[torch.Tensor], stepping: bool = False) -> None:
        super().clear_grads(masters)
        if self.stream is not None and not stepping:
            self.stream.synchronize()   # a skipped step's copies must not land in the next one
        if self.double_buffer:          # the running step keeps reading the other buffer
            self.host_grads, self.spare_grads = self.spare_grads, self.host_grads
        self.owned = []
        self.filled = [0] * len(self.filled)

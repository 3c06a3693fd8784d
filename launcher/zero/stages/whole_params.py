"""Stages 0, 1 and 2: one strategy composed of three policies.

The model parameters stay whole on every rank, flattened into one buffer per optimizer group,
with gradient hooks feeding a bucket queue. What differs between the stages is three choices:

* a *partitioning* (sharding.py): which flat range of each group this rank's master covers:
  all of it (stage 0), or its partition, all-gathered after the step (stages 1 and 2);
* a *gradient reduction* (stage0.py, stage1.py, stage2.py): how gradients accumulate and reach
  that range: all-reduce at the boundary; reduce to the owners at the boundary; reduce to the
  owners on every micro-step, keeping no whole gradients;
* an *optimizer placement* (placement.py): masters on the device, or in host memory (offload).

Each stage module names one combination; ``WholeParamsStrategy`` runs it.

Glossary: a *piece* is the flat range of one group that one master tensor covers, and its index
is that master's *position*. A group's partition is one piece, or two with
``offload_optimizer.ratio`` below 1: a leading piece whose master, moments and step stay on the
device and a piece offloaded to the host (the cut: partial_offload.partition_kept).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from launcher.zero.distributed.collectives import broadcast_module_from_first, gradient_scales, reduce_async, wait
from launcher.zero.errors import ConfigError
from launcher.zero.layout.flat import ParamGroup, collect_groups, flatten_into_buffer
from launcher.zero.experts.wiring import broadcast_from_first, counted_once_square_sum
from launcher.zero.stages.base import Fragment, ZeroStrategy, squares_of
from launcher.zero.stages.buckets import BucketQueue, plan_all_buckets, register_grad_hooks
from launcher.zero.stages.partial_offload import partition_kept
from launcher.zero.optim.cpu_adam import CPUAdam
from launcher.zero.stages.placement import OnDevice, OnHost
from launcher.zero.stages.step_overlap import FirstUseOrder, StepOverlap


@dataclass(frozen=True)
class Piece:
    """The flat range [low, high) of ``self.groups[group]``'s buffer that one master covers."""

    group: int
    low: int
    high: int
    on_device: bool = False   # offload_optimizer.ratio: its optimizer state stays on the device


class WholeParamsStrategy(ZeroStrategy):
    """A stage 0-2 strategy; subclasses only name their three policies."""

    partitioning_policy: ClassVar[type]
    reduction_policy: ClassVar[type]
    placement_policy: ClassVar[type] = OnDevice

    def __init__(self, context):
        super().__init__(context)
        self.partitioning = self.partitioning_policy(context)
        self.reduction = self.reduction_policy()
        self.placement = self.placement_policy(context)

    @property
    def masters_on_device(self) -> bool:
        return not isinstance(self.placement, OnHost)

    @property
    def partitioned_grads(self) -> bool:
        """Norms need a sum over ranks: sharded masters, or local grads (the optimizer communicates)."""
        return self.partitioning.sharded or not self.context.reduce_gradients

    def setup(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if any(optimizer.state.values()):
            raise ConfigError("optimizer: the client optimizer already holds state",
                              hint="pass a freshly built optimizer to zero.initialize")
        ctx = self.context
        self.module, self.optimizer = module, optimizer
        experts = ctx.parallel.experts   # MoE: expert param groups live on their expert-data ranks
        if experts:
            broadcast_from_first(module, ctx.parallel.data, experts)
        else:
            broadcast_module_from_first(module, ctx.parallel.data)
        contexts = [ctx.parallel.param_group_context(group) for group in optimizer.param_groups]
        self.groups: list[ParamGroup] = collect_groups(module, optimizer, lambda i: self.partitioning.count(contexts[i]))
        for group in self.groups:
            group.dist_context = contexts[group.index]
        self.param_buffers = [flatten_into_buffer(group, ctx.dist_context.device, ctx.precision.param_dtype)
                              for group in self.groups]
        bounds = [self.partitioning.bounds(group) for group in self.groups]
        self.pieces = self._plan_pieces(optimizer, bounds)
        #: per group position, the positions of its pieces
        self.pieces_of = [[i for i, p in enumerate(self.pieces) if p.group == g] for g in range(len(self.groups))]
        self.masters = [self._build_master(piece) for piece in self.pieces]
        for position, group in enumerate(self.groups):
            optimizer.param_groups[group.index]["params"] = [master for master, piece in zip(self.masters, self.pieces)
                                                             if piece.group == position]
        order = {name: index for index, (name, _) in enumerate(module.named_parameters())}
        bucket_numel = self.placement.bucket_numel(int(ctx.config.zero_optimization.reduce_bucket_size))
        self.plan = plan_all_buckets(self.groups, bucket_numel, order)
        members = [[(g, slot) for slot in range(b.first, b.last)] for g, b in self.plan]
        self.queue = BucketQueue(members, self.reduction.launch)
        self.pre_scale, self.post_scale = gradient_scales(ctx.config, ctx.dist_context.world_size)
        self.pending: list = []
        self.hooks = []
        for group in self.groups:
            self.hooks += register_grad_hooks(group.params, lambda i, g=group.index: self.reduction.on_grad(g, i))
        self.reduction.bind(self)
        self.placement.attach(optimizer, self.masters, [self.param_buffers[p.group][p.low:p.high] for p in self.pieces],
                              [_covered(self.groups[p.group], p.low, p.high) for p in self.pieces])
        offload = ctx.config.zero_optimization.offload_optimizer
        if isinstance(self.placement, OnHost) and offload is not None and offload.overlap_step:
            self._start_overlap(module, optimizer, order)

    def _plan_pieces(self, optimizer, bounds: list[tuple[int, int]]) -> list[Piece]:
        """One piece per group's partition; with ``offload_optimizer.ratio`` below 1 the leading
        fragments of DeepSpeed's first ``int((1 - ratio) * count)`` sub-groups (counted over this
        rank's partitions) make a piece of their own that stays on the device."""
        offload = self.context.config.zero_optimization.offload_optimizer
        ratio = float(offload.ratio) if isinstance(self.placement, OnHost) and offload is not None else 1.0
        whole = [Piece(position, low, high) for position, (low, high) in enumerate(bounds)]
        if ratio >= 1.0:
            return whole
        if not isinstance(optimizer, CPUAdam):   # as stage 3 (DeepSpeed's hybrid optimizer is its CPU Adam)
            raise ConfigError(f"zero_optimization.offload_optimizer.ratio {ratio} needs the CPU Adam, not "
                              f"{type(optimizer).__name__}",
                              hint='use "optimizer": {"type": "AdamW"} (or Adam), which offload builds as the '
                                   "CPU Adam, or remove ratio")
        inside = [[(max(low, s.offset), min(high, s.end)) for s in group.layout.slots if s.offset < high and s.end > low]
                  for group, (low, high) in zip(self.groups, bounds)]
        kept = partition_kept([[end - start for start, end in each] for each in inside],
                              int(self.context.config.zero_optimization.sub_group_size), ratio)
        pieces = []
        for piece, each, count in zip(whole, inside, kept):
            cut = piece.low if count == 0 else piece.high if count == len(each) else each[count - 1][1]
            parts = [Piece(piece.group, piece.low, cut, True), Piece(piece.group, cut, piece.high)]
            pieces += [part for part in parts if part.high > part.low] or [piece]
        return pieces

    def _start_overlap(self, module: torch.nn.Module, optimizer, order: dict[str, int]) -> None:
        """overlap_step: a background step; at world size 1 each module waits for its own weights
        (with more ranks the updated partitions are all-gathered first, so the forward waits whole)."""
        _prepare_of(optimizer)
        self.overlap = StepOverlap(self.context.dist_context.device)
        self.placement.overlap = self.overlap
        if hasattr(optimizer, "chunk_priority"):
            starts, ranks = [], []
            for piece in self.pieces:
                inside = [s for s in self.groups[piece.group].layout.slots if s.offset < piece.high and s.end > piece.low]
                starts.append([max(s.offset, piece.low) - piece.low for s in inside])
                ranks.append([order[s.name] for s in inside])
            optimizer.chunk_priority = FirstUseOrder(self.masters, starts, ranks)
        if self.context.dist_context.world_size > 1:
            return
        needs: dict[int, list[tuple[int, int]]] = {}   # a parameter -> (position, elements it needs final)
        for position, piece in enumerate(self.pieces):
            group = self.groups[piece.group]
            for param, slot in zip(group.params, group.layout.slots):
                if slot.offset < piece.high and slot.end > piece.low:
                    needs.setdefault(id(param), []).append((position, min(slot.end, piece.high) - piece.low))
        for child in module.modules():
            wants: dict[int, int] = {}
            for param in child.parameters(recurse=False):
                for position, end in needs.get(id(param), ()):
                    wants[position] = max(wants.get(position, 0), end)
            if wants:
                marks = tuple(wants.items())
                self.hooks.append(child.register_forward_pre_hook(
                    lambda _module, _args, marks=marks: self._wait_for_weights(marks), prepend=True))

    def _wait_for_weights(self, marks) -> None:
        if self.overlap.busy:
            for position, end in marks:
                self.overlap.wait_for(position, end)

    def _build_master(self, piece: Piece) -> torch.Tensor:
        weights = self.param_buffers[piece.group][piece.low:piece.high]
        master, self.aliased = self.placement.build(weights, self.partitioning.may_alias(), piece.on_device)
        return master

    # ---- backward ------------------------------------------------------------------------
    @property
    def communicates(self) -> bool:
        return self.context.reduce_gradients and self.context.dist_context.world_size > 1

    def pre_forward(self) -> None:
        if self.overlap is not None and self.context.dist_context.world_size > 1:
            self.wait_for_step()

    def pre_backward(self, is_boundary: bool) -> None:
        self.reduction.pre_backward(is_boundary)

    def post_backward(self, is_boundary: bool) -> None:
        self.queue.flush()
        self.finish_pending()

    def reduce_to_owners(self, group: ParamGroup, source: torch.Tensor, start: int, accumulate) -> None:
        """Reduce ``source`` (flat range starting at ``start``) piecewise to each piece's owner.

        ``accumulate(offset_in_partition, reduced_piece)`` runs on the owner once the reduction
        is complete (in ``finish_pending``), after the post-scale.
        """
        rank = group.dist_context.rank
        low, _ = self.partitioning.bounds(group)
        for piece in group.layout.split_by_owner(start, start + source.numel()):
            work = source[piece.flat_start - start:piece.flat_end - start]
            handle = reduce_async(work, piece.rank, group.dist_context)
            if piece.rank != rank:
                self.pending.append((handle, lambda: None))
                continue

            def done(work=work, offset=piece.flat_start - low):
                if self.post_scale != 1.0:
                    work.mul_(self.post_scale)
                accumulate(offset, work)
            self.pending.append((handle, done))

    def finish_pending(self) -> None:
        """Wait for in-flight collectives and run their completion callbacks in launch order."""
        pending, self.pending = self.pending, []
        wait(handle for handle, _ in pending)
        for _, done in pending:
            done()

    def grad_ready(self, position: int, offset: int, grad: torch.Tensor) -> None:
        """The reduction's report: ``grad`` at ``offset`` into group ``position``'s partition is final
        for this step; the placement hears it per piece."""
        low = self.partitioning.bounds(self.groups[position])[0]
        for index in self.pieces_of[position]:
            piece = self.pieces[index]
            start, end = max(piece.low - low, offset), min(piece.high - low, offset + grad.numel())
            if start < end:
                self.placement.grad_ready(index, start - (piece.low - low), grad[start - offset:end - offset])

    def owned_pieces(self) -> list[torch.Tensor]:
        """Each master's gradient: its piece of the reduction's owned range."""
        owned = [self.reduction.owned(position) for position in range(len(self.groups))]
        lows = [self.partitioning.bounds(group)[0] for group in self.groups]
        return [owned[p.group][p.low - lows[p.group]:p.high - lows[p.group]] for p in self.pieces]

    def group_position(self, group_index: int) -> int:
        """Position in self.groups of the optimizer group ``group_index``."""
        for position, group in enumerate(self.groups):
            if group.index == group_index:
                return position
        raise KeyError(group_index)

    # ---- the step ------------------------------------------------------------------------
    def prepare_master_grads(self, defer_cast: bool = False) -> None:
        # a deferred cast leaves master.grad unset: only where nothing reads it before the step
        # (no before_norm hook; the tensor-parallel norm reads the masters' fragments)
        defer_cast = defer_cast and not self.before_norm and self.context.parallel.size("tensor") == 1
        whole = [self.reduction.owned(position) for position in range(len(self.groups))]
        self.placement.give_grads(self.masters, self.owned_pieces(), whole, defer_cast=defer_cast)
        for call in self.before_norm:
            call()

    def cast_master_grads(self, scale: torch.Tensor | None) -> bool:
        return self.placement.cast_grads(self.masters, scale)

    def master_tensors(self) -> list[torch.Tensor]:
        return list(self.masters)

    def norm_grads(self) -> list[torch.Tensor | None]:
        return self.placement.norm_grads(self.masters)

    def data_square_sum(self) -> torch.Tensor:
        if not self.context.parallel.experts:
            return super().data_square_sum()
        # MoE: each parameter counted once, whatever ranks hold copies of it
        device = self.context.dist_context.device
        parts = [(squares_of([grad], device), self.groups[piece.group].dist_context.world_size)
                 for grad, piece in zip(self.norm_grads(), self.pieces)]
        return counted_once_square_sum(parts, self.partitioned_grads, self.context.dist_context)

    def local_square_sum(self) -> torch.Tensor:
        measured = self.placement.take_square_sum()   # offload measures while the last copies land
        return measured if measured is not None else super().local_square_sum()

    def scale_master_grads(self, factor: float) -> None:
        if not self.placement.takes_factor(factor):
            super().scale_master_grads(factor)

    def after_optimizer_step(self) -> None:
        self._write_back()
        self._gather()

    def _write_back(self) -> None:
        with torch.no_grad():
            for position, (piece, master) in enumerate(zip(self.pieces, self.masters)):
                if not self.aliased:
                    self.placement.write_back(self.param_buffers[piece.group][piece.low:piece.high], master, position)

    def _gather(self) -> None:
        with torch.no_grad():
            for group, buffer in zip(self.groups, self.param_buffers):
                low, high = self.partitioning.bounds(group)
                self.partitioning.gather(buffer, low, high, group.dist_context)

    def start_background_step(self, optimizer) -> None:
        """overlap_step: the CPU Adam and the uploads run in the worker thread; the gradients are
        dropped here at once (the step reads the other host buffer); the all-gather of more than
        one rank runs in this thread when the step is waited for, never beside another collective."""
        update = optimizer.prepare_step()
        self.reduction.zero()
        self.placement.clear_grads(self.masters, stepping=True)

        def work():
            update()
            self._write_back()
        self.overlap.start(len(self.masters), work)

    def wait_for_step(self) -> None:
        if self.overlap is not None and self.overlap.busy:
            self.overlap.wait()
            if self.partitioning.sharded and self.context.dist_context.world_size > 1:
                self._gather()

    def zero_grad(self) -> None:
        self.reduction.zero()
        self.placement.clear_grads(self.masters)

    # ---- checkpoints and reporting -------------------------------------------------------
    def fragments(self) -> list[Fragment]:
        found = []
        for piece, master in zip(self.pieces, self.masters):
            group, low, high = self.groups[piece.group], piece.low, piece.high
            for slot in group.layout.slots:
                start, end = max(low, slot.offset), min(high, slot.end)
                if start < end:
                    found.append(Fragment(name=slot.name, group=group.index, master=master,
                                          master_offset=start - low, param_start=start - slot.offset,
                                          numel=end - start, shape=slot.shape))
        return found

    def grad_of(self, fragment: Fragment) -> torch.Tensor:
        position = next(i for i, master in enumerate(self.masters) if master is fragment.master)
        return self.owned_pieces()[position]

    def offloaded_numel(self) -> int:
        if not isinstance(self.placement, OnHost):
            return 0
        return sum(master.numel() for master, piece in zip(self.masters, self.pieces) if not piece.on_device)

    def memory_breakdown(self) -> dict[str, int]:
        trainable = {id(p) for group in self.groups for p in group.params}
        frozen = sum(p.numel() * p.element_size() for p in self.module.parameters() if id(p) not in trainable)
        params = sum(b.numel() * b.element_size() for b in self.param_buffers) + frozen
        masters = 0 if self.aliased else sum(m.numel() * m.element_size() for m in self.masters)
        parts = {"parameters": params, "gradients": self.reduction.nbytes(), "master_weights": masters,
                 "optimizer_states": self.optimizer_state_bytes()}
        host_gradients = self.placement.host_gradient_bytes()
        if host_gradients is not None:   # offload: the gradients' copies in host memory
            parts["host_gradients"] = host_gradients
        return parts


def _prepare_of(optimizer):
    """The optimizer's ``prepare_step`` (our CPU Adam has one); a ConfigError without it."""
    prepare = getattr(optimizer, "prepare_step", None)
    if prepare is None:
        raise ConfigError(f"zero_optimization.offload_optimizer.overlap_step needs the engine's CPU Adam, "
                          f"the optimizer is {type(optimizer).__name__}",
                          hint='use "optimizer": {"type": "AdamW"} in the config (or pass '
                               'launcher.zero.optim.cpu_adam.CPUAdam), or remove overlap_step')
    return prepare


def _covered(group: ParamGroup, low: int, high: int) -> int:
    """Elements of [low, high) that belong to a parameter (the rest is padding)."""
    return sum(max(0, min(high, slot.end) - max(low, slot.offset)) for slot in group.layout.slots)

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
"""
from __future__ import annotations

from typing import ClassVar

import torch

from launcher.zero.distributed.collectives import broadcast_module_from_first, gradient_scales, reduce_async, wait
from launcher.zero.errors import ConfigError
from launcher.zero.layout.flat import ParamGroup, collect_groups, flatten_into_buffer
from launcher.zero.experts.wiring import broadcast_from_first, counted_once_square_sum
from launcher.zero.stages.base import Fragment, ZeroStrategy, squares_of
from launcher.zero.stages.buckets import BucketQueue, plan_all_buckets, register_grad_hooks
from launcher.zero.stages.placement import OnDevice, OnHost
from launcher.zero.stages.step_overlap import FirstUseOrder, StepOverlap


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
        self.masters = [self._build_master(group, buffer) for group, buffer in zip(self.groups, self.param_buffers)]
        for group, master in zip(self.groups, self.masters):
            optimizer.param_groups[group.index]["params"] = [master]
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
        bounds = [self.partitioning.bounds(group) for group in self.groups]
        self.placement.attach(optimizer, self.masters, [b[low:high] for b, (low, high) in zip(self.param_buffers, bounds)],
                              [_covered(group, low, high) for group, (low, high) in zip(self.groups, bounds)])
        offload = ctx.config.zero_optimization.offload_optimizer
        if isinstance(self.placement, OnHost) and offload is not None and offload.overlap_step:
            self._start_overlap(module, optimizer, bounds, order)

    def _start_overlap(self, module: torch.nn.Module, optimizer, bounds, order: dict[str, int]) -> None:
        """overlap_step: a background step; at world size 1 each module waits for its own weights
        (with more ranks the updated partitions are all-gathered first, so the forward waits whole)."""
        _prepare_of(optimizer)
        self.overlap = StepOverlap(self.context.dist_context.device)
        self.placement.overlap = self.overlap
        if hasattr(optimizer, "chunk_priority"):
            starts, ranks = [], []
            for group, (low, high) in zip(self.groups, bounds):
                inside = [s for s in group.layout.slots if s.offset < high and s.end > low]
                starts.append([max(s.offset, low) - low for s in inside])
                ranks.append([order[s.name] for s in inside])
            optimizer.chunk_priority = FirstUseOrder(self.masters, starts, ranks)
        if self.context.dist_context.world_size > 1:
            return
        needs = {}
        for position, (group, (low, high)) in enumerate(zip(self.groups, bounds)):
            for param, slot in zip(group.params, group.layout.slots):
                needs[id(param)] = (position, min(slot.end, high) - low)
        for child in module.modules():
            wants: dict[int, int] = {}
            for param in child.parameters(recurse=False):
                if id(param) in needs:
                    position, end = needs[id(param)]
                    wants[position] = max(wants.get(position, 0), end)
            if wants:
                marks = tuple(wants.items())
                self.hooks.append(child.register_forward_pre_hook(
                    lambda _module, _args, marks=marks: self._wait_for_weights(marks), prepend=True))

    def _wait_for_weights(self, marks) -> None:
        if self.overlap.busy:
            for position, end in marks:
                self.overlap.wait_for(position, end)

    def _build_master(self, group: ParamGroup, buffer: torch.Tensor) -> torch.Tensor:
        low, high = self.partitioning.bounds(group)
        master, self.aliased = self.placement.build(buffer[low:high], self.partitioning.may_alias())
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
        self.placement.give_grads(self.masters, [self.reduction.owned(p) for p in range(len(self.groups))],
                                  defer_cast=defer_cast)
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
        parts = [(squares_of([grad], device), group.dist_context.world_size)
                 for grad, group in zip(self.norm_grads(), self.groups)]
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
            for position, (group, buffer, master) in enumerate(zip(self.groups, self.param_buffers, self.masters)):
                low, high = self.partitioning.bounds(group)
                if not self.aliased:
                    self.placement.write_back(buffer[low:high], master, position)

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
        for group, master in zip(self.groups, self.masters):
            low, high = self.partitioning.bounds(group)
            for slot in group.layout.slots:
                start, end = max(low, slot.offset), min(high, slot.end)
                if start < end:
                    found.append(Fragment(name=slot.name, group=group.index, master=master,
                                          master_offset=start - low, param_start=start - slot.offset,
                                          numel=end - start, shape=slot.shape))
        return found

    def grad_of(self, fragment: Fragment) -> torch.Tensor:
        return self.reduction.owned(self.group_position(fragment.group))

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

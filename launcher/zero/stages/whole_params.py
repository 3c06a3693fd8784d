"""What stages 0-2 share: parameters flattened per optimizer group, grad hooks, a bucket queue."""
from __future__ import annotations

import torch

from launcher.zero.stages.buckets import BucketQueue, plan_all_buckets, register_grad_hooks
from launcher.zero.collectives import broadcast_module_from_first, gradient_scales, wait
from launcher.zero.errors import ConfigError
from launcher.zero.layout.flat import ParamGroup, collect_groups, flatten_into_buffer
from launcher.zero.stages.base import Fragment, ZeroStrategy


class FlatStrategy(ZeroStrategy):
    """Base for stages whose model parameters stay whole on every rank (0, 1, 2).

    Subclasses implement ``build_masters`` (one master tensor per group), ``on_grad`` (a
    parameter's gradient is final) and ``launch`` (send bucket k).
    """

    def setup(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if any(optimizer.state.values()):
            raise ConfigError("optimizer: the client optimizer already holds state",
                              hint="pass a freshly built optimizer to zero.initialize")
        ctx = self.context
        self.module, self.optimizer = module, optimizer
        broadcast_module_from_first(module, ctx.dist)
        self.groups: list[ParamGroup] = collect_groups(module, optimizer, self.partition_count())
        self.param_buffers = [flatten_into_buffer(group, ctx.dist.device, ctx.precision.param_dtype)
                              for group in self.groups]
        self.masters: list[torch.Tensor] = [self.build_master(group) for group in self.groups]
        for group, master in zip(self.groups, self.masters):
            optimizer.param_groups[group.index]["params"] = [master]
        order = {name: index for index, (name, _) in enumerate(module.named_parameters())}
        bucket_numel = int(ctx.config.zero_optimization.reduce_bucket_size)
        self.plan = plan_all_buckets(self.groups, bucket_numel, order)
        members = [[(g, slot) for slot in range(b.first, b.last)] for g, b in self.plan]
        self.queue = BucketQueue(members, self.launch)
        self.pre_scale, self.post_scale = gradient_scales(ctx.config, ctx.dist.world_size)
        self.pending: list = []
        self.hooks = []
        for group in self.groups:
            self.hooks += register_grad_hooks(group.params, lambda i, g=group.index: self.on_grad(g, i))
        self.after_setup()

    # ---- subclass points -----------------------------------------------------------------
    def partition_count(self) -> int:
        return self.context.dist.world_size

    def build_master(self, group: ParamGroup) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def after_setup(self) -> None:
        pass

    def on_grad(self, group_index: int, slot: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def launch(self, bucket_index: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # ---- shared behaviour ----------------------------------------------------------------
    def attach_grad_buffers(self, arm: bool) -> None:
        """Stages that keep whole gradients (0, 1): point grads at the buffers; arm the buckets."""
        for grads in self.grad_buffers:
            grads.attach()
        if arm:
            self.queue.arm()

    def absorb_grad(self, group_index: int, slot: int) -> None:
        """A parameter's gradient is ready: take it into its buffer and mark its bucket."""
        self.grad_buffers[self.group_position(group_index)].absorb(slot)
        self.queue.mark((group_index, slot))

    @property
    def communicates(self) -> bool:
        return self.context.reduce_gradients and self.context.dist.world_size > 1

    def group_position(self, group_index: int) -> int:
        """Position in self.groups of the optimizer group ``group_index``."""
        for position, group in enumerate(self.groups):
            if group.index == group_index:
                return position
        raise KeyError(group_index)

    def finish_pending(self) -> None:
        """Wait for in-flight collectives and run their completion callbacks in launch order."""
        pending, self.pending = self.pending, []
        wait(handle for handle, _ in pending)
        for _, done in pending:
            done()

    def master_tensors(self) -> list[torch.Tensor]:
        return list(self.masters)

    def frozen_param_bytes(self) -> int:
        trainable = {id(p) for group in self.groups for p in group.params}
        return sum(p.numel() * p.element_size() for p in self.module.parameters() if id(p) not in trainable)

    def fragments_for(self, group: ParamGroup, master: torch.Tensor, low: int, high: int) -> list[Fragment]:
        """Fragments of ``group``'s parameters inside the flat range [low, high) held by ``master``."""
        found = []
        for slot in group.layout.slots:
            start, end = max(low, slot.offset), min(high, slot.end)
            if start < end:
                found.append(Fragment(name=slot.name, group=group.index, master=master,
                                      master_offset=start - low, param_start=start - slot.offset,
                                      numel=end - start, shape=slot.shape))
        return found

"""ZeRO stage 2: gradients reduced into their owner's partition during backward, then dropped.

Each bucket's gradients are copied into a staging buffer as backward produces them (the
parameter's ``.grad`` is freed at once), reduced piecewise to the owning ranks, and added into
the owner's persistent gradient partition; so no rank ever holds the full gradients.
"""
from __future__ import annotations

import torch

from launcher.zero.stages.partitioned_masters import PartitionedStrategy


class Stage2Strategy(PartitionedStrategy):
    """Stage 1 plus partitioned gradients; reduces on every micro-step (accumulation included)."""

    stage = 2

    def after_setup(self) -> None:
        ctx = self.context
        self.grad_partitions = [torch.zeros(group.layout.partition_numel, dtype=ctx.precision.grad_accum_dtype,
                                            device=ctx.dist.device) for group in self.groups]
        self.staging: dict[int, torch.Tensor] = {}
        self.bucket_of = {key: index for index, keys in enumerate(
            [[(g, s) for s in range(b.first, b.last)] for g, b in self.plan]) for key in keys}

    def pre_backward(self, is_boundary: bool) -> None:
        self.queue.arm()

    def _staging(self, bucket_index: int) -> torch.Tensor:
        buffer = self.staging.get(bucket_index)
        if buffer is None:
            _, bucket = self.plan[bucket_index]
            buffer = torch.zeros(bucket.numel, dtype=self.context.precision.comm_dtype, device=self.context.dist.device)
            self.staging[bucket_index] = buffer
        return buffer

    def on_grad(self, group_index: int, slot: int) -> None:
        if self._stage(group_index, slot):
            self.queue.mark((group_index, slot))

    def _stage(self, group_index: int, slot: int) -> bool:
        """Move parameter ``slot``'s gradient into its bucket's staging buffer."""
        group = self.groups[self.group_position(group_index)]
        param = group.params[slot]
        if param.grad is None:
            return False
        bucket_index = self.bucket_of[(group_index, slot)]
        _, bucket = self.plan[bucket_index]
        info = group.layout.slots[slot]
        start = info.offset - bucket.start
        target = self._staging(bucket_index)[start:start + info.numel]
        target.add_(param.grad.detach().reshape(-1))
        param.grad = None  # the point of stage 2: whole gradients never accumulate
        return True

    def launch(self, bucket_index: int) -> None:
        group_index, bucket = self.plan[bucket_index]
        position = self.group_position(group_index)
        group = self.groups[position]
        for index in range(bucket.first, bucket.last):  # late or unused parameters
            self._stage(group_index, index)
        work = self._staging(bucket_index)
        if self.pre_scale != 1.0:
            work.mul_(self.pre_scale)

        def accumulate(group, offset, reduced, position=position):
            self.grad_partitions[position][offset:offset + reduced.numel()].add_(reduced)
        self.reduce_to_owners(group, work, bucket.start, accumulate)
        self.pending.append((None, lambda index=bucket_index: self.staging.pop(index, None)))
        if not self.context.config.overlap_comm:
            self.finish_pending()

    def post_backward(self, is_boundary: bool) -> None:
        self.queue.flush()
        self.finish_pending()

    def prepare_master_grads(self) -> None:
        for master, partition in zip(self.masters, self.grad_partitions):
            master.grad = partition if partition.dtype == master.dtype else partition.to(master.dtype)

    def zero_grad(self) -> None:
        for master, partition in zip(self.masters, self.grad_partitions):
            partition.zero_()
            master.grad = None
        for group in self.groups:
            for param in group.params:
                param.grad = None

    def memory_breakdown(self) -> dict[str, int]:
        grads = sum(p.numel() * p.element_size() for p in self.grad_partitions)
        return {"parameters": self.param_bytes(), "gradients": grads, "master_weights": self.master_bytes(),
                "optimizer_states": self.optimizer_state_bytes()}

"""ZeRO stage 2: gradients reduced into their owner's partition during backward, then dropped.

Each bucket's gradients are copied into a staging buffer as backward produces them (the
parameter's ``.grad`` is freed at once), reduced piecewise to the owning ranks, and added into
the owner's persistent gradient partition; so no rank ever holds the full gradients. This
happens on every micro-step, accumulation included. The first reduction of a bucket after
``zero_grad`` is copied into the partition, later ones added: the step makes no zeroing pass
over the gradients (issue 39).
"""
from __future__ import annotations

import torch

from launcher.zero.stages.sharding import Sharded
from launcher.zero.stages.whole_params import WholeParamsStrategy


class ReduceEveryMicroStep:
    """Staging buffers per bucket, reduced to the owners; a persistent partition of the grads."""

    def bind(self, strategy) -> None:
        self.strategy = strategy
        ctx = strategy.context
        self.grad_partitions = [torch.zeros(group.layout.partition_numel, dtype=ctx.precision.grad_accum_dtype,
                                            device=ctx.dist_context.device) for group in strategy.groups]
        self.staging: dict[int, torch.Tensor] = {}
        self.boundary = True
        #: buckets whose ranges of grad_partitions hold no gradient since ``zero``: their next
        #: reduction is copied over the partition instead of added (no zeroing pass per step)
        self.unwritten = set(range(len(strategy.plan)))
        self.bucket_of = {(g, slot): index for index, (g, bucket) in enumerate(strategy.plan)
                          for slot in range(bucket.first, bucket.last)}

    def pre_backward(self, is_boundary: bool) -> None:
        self.boundary = is_boundary
        self.strategy.queue.arm()

    def _staging(self, bucket_index: int) -> torch.Tensor:
        buffer = self.staging.get(bucket_index)
        if buffer is None:
            _, bucket = self.strategy.plan[bucket_index]
            ctx = self.strategy.context
            buffer = torch.zeros(bucket.numel, dtype=ctx.precision.comm_dtype, device=ctx.dist_context.device)
            self.staging[bucket_index] = buffer
        return buffer

    def on_grad(self, group_index: int, slot: int) -> None:
        if self._stage(group_index, slot):
            self.strategy.queue.mark((group_index, slot))

    def _stage(self, group_index: int, slot: int) -> bool:
        """Move parameter ``slot``'s gradient into its bucket's staging buffer."""
        group = self.strategy.groups[self.strategy.group_position(group_index)]
        param = group.params[slot]
        if param.grad is None:
            return False
        bucket_index = self.bucket_of[(group_index, slot)]
        _, bucket = self.strategy.plan[bucket_index]
        info = group.layout.slots[slot]
        start = info.offset - bucket.start
        self._staging(bucket_index)[start:start + info.numel].add_(param.grad.detach().reshape(-1))
        param.grad = None  # the point of stage 2: whole gradients never accumulate
        return True

    def launch(self, bucket_index: int) -> None:
        strategy = self.strategy
        group_index, bucket = strategy.plan[bucket_index]
        position = strategy.group_position(group_index)
        for index in range(bucket.first, bucket.last):  # late or unused parameters
            self._stage(group_index, index)
        work = self._staging(bucket_index)
        if strategy.pre_scale != 1.0:
            work.mul_(strategy.pre_scale)
        partition = self.grad_partitions[position]
        first = bucket_index in self.unwritten   # every micro-step launches every bucket (queue.flush)
        self.unwritten.discard(bucket_index)

        def accumulate(offset, reduced):
            final = partition[offset:offset + reduced.numel()]
            if first:
                final.copy_(reduced)
            else:
                final.add_(reduced)
            if self.boundary:   # this range is now final for the step: offload copies it at once
                strategy.grad_ready(position, offset, final)
        strategy.reduce_to_owners(strategy.groups[position], work, bucket.start, accumulate)
        strategy.pending.append((None, lambda: self.staging.pop(bucket_index, None)))
        if not strategy.context.config.overlap_comm:
            strategy.finish_pending()

    def owned(self, position: int) -> torch.Tensor:
        """This rank's gradient partition of group ``position``; ranges no reduction wrote since
        ``zero`` are zeroed first (read before a backward, e.g. by safe_set_full_grad)."""
        strategy = self.strategy
        group = strategy.groups[position]
        low, high = strategy.partitioning.bounds(group)
        for index in sorted(self.unwritten):
            group_index, bucket = strategy.plan[index]
            if group_index == group.index:
                self.unwritten.discard(index)
                start, end = max(bucket.start, low), min(bucket.end, high)
                if start < end:
                    self.grad_partitions[position][start - low:end - low].zero_()
        return self.grad_partitions[position]

    def zero(self) -> None:
        # no memset: the next reductions overwrite their ranges (``unwritten``); the partition's
        # padding past the last bucket is never written and stays zero from ``bind``
        self.unwritten = set(range(len(self.strategy.plan)))
        for group in self.strategy.groups:
            for param in group.params:
                param.grad = None

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.grad_partitions)


class Stage2Strategy(WholeParamsStrategy):
    stage = 2
    partitioning_policy = Sharded
    reduction_policy = ReduceEveryMicroStep

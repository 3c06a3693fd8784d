"""What stages 1 and 2 share: fp32 masters and optimizer state for this rank's partition only.

After each optimizer step the updated partitions are all-gathered so that every rank again
holds the whole model (``allgather_partitions``).
"""
from __future__ import annotations

import torch

from launcher.zero.collectives import all_gather_into, reduce_async
from launcher.zero.layout.flat import ParamGroup
from launcher.zero.stages.whole_params import FlatStrategy
from launcher.zero.stages.base import Fragment


class PartitionedStrategy(FlatStrategy):
    """Masters, master grads and optimizer state cover ``partition_range(rank)`` of each group."""

    partitioned_grads = True

    def partition_bounds(self, group: ParamGroup) -> tuple[int, int]:
        return group.layout.partition_range(self.context.dist.rank)

    def build_master(self, group: ParamGroup) -> torch.Tensor:
        buffer = self.param_buffers[self.group_position(group.index)]
        low, high = self.partition_bounds(group)
        self.aliased = buffer.dtype == self.context.precision.master_dtype
        if self.aliased:  # fp32 training: the master is this rank's slice of the weights
            return buffer[low:high]
        return buffer[low:high].detach().to(self.context.precision.master_dtype).clone()

    def reduce_to_owners(self, group: ParamGroup, source: torch.Tensor, start: int, accumulate) -> None:
        """Reduce ``source`` (flat range starting at ``start``) piecewise to each piece's owner.

        ``accumulate(group, offset_in_partition, reduced_piece)`` runs on the owner once the
        reduction is complete (in ``finish_pending``).
        """
        rank = self.context.dist.rank
        low, _ = self.partition_bounds(group)
        for piece in group.layout.split_by_owner(start, start + source.numel()):
            work = source[piece.flat_start - start:piece.flat_end - start]
            handle = reduce_async(work, piece.rank, self.context.dist)
            if piece.rank == rank:
                offset = piece.flat_start - low

                def done(work=work, offset=offset):
                    if self.post_scale != 1.0:
                        work.mul_(self.post_scale)
                    accumulate(group, offset, work)
                self.pending.append((handle, done))
            else:
                self.pending.append((handle, lambda: None))

    def after_optimizer_step(self) -> None:
        with torch.no_grad():
            for group, buffer, master in zip(self.groups, self.param_buffers, self.masters):
                low, high = self.partition_bounds(group)
                if not self.aliased:
                    buffer[low:high].copy_(master)
                if self.context.dist.world_size > 1:
                    self._all_gather(buffer, low, high - low)

    def _all_gather(self, buffer: torch.Tensor, low: int, partition_numel: int) -> None:
        """Every rank's updated partition into every rank's buffer, ``allgather_bucket_size`` at a time."""
        chunk = max(1, int(self.context.config.zero_optimization.allgather_bucket_size))
        world_size = self.context.dist.world_size
        if chunk >= partition_numel:
            all_gather_into(buffer, buffer[low:low + partition_numel].clone(), self.context.dist)
            return
        for start in range(0, partition_numel, chunk):
            count = min(chunk, partition_numel - start)
            gathered = torch.empty(world_size * count, dtype=buffer.dtype, device=buffer.device)
            all_gather_into(gathered, buffer[low + start:low + start + count].clone(), self.context.dist)
            for rank in range(world_size):
                offset = rank * partition_numel + start
                buffer[offset:offset + count].copy_(gathered[rank * count:(rank + 1) * count])

    def fragments(self) -> list[Fragment]:
        found = []
        for group, master in zip(self.groups, self.masters):
            low, high = self.partition_bounds(group)
            found += self.fragments_for(group, master, low, high)
        return found

    def master_bytes(self) -> int:
        return 0 if self.aliased else sum(m.numel() * m.element_size() for m in self.masters)

    def param_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.param_buffers) + self.frozen_param_bytes()

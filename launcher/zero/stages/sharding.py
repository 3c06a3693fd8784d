"""Partitioning policies of stages 0-2: which flat range of each group this rank's master covers.

``Replicated`` (stage 0): the whole group, on every rank. ``Sharded`` (stages 1 and 2): this
rank's ``partition_range``; after each optimizer step the updated partitions are all-gathered
so that every rank again holds the whole model.
"""
from __future__ import annotations

import torch

from launcher.zero.distributed.collectives import all_gather_into
from launcher.zero.layout.flat import ParamGroup


class Replicated:
    """Every rank's master covers all of its group; nothing to gather after the step."""

    sharded = False

    def __init__(self, context):
        self.context = context

    def count(self, dist_context=None) -> int:
        return 1

    def bounds(self, group: ParamGroup) -> tuple[int, int]:
        return 0, group.layout.padded_numel

    def may_alias(self) -> bool:
        """fp32 weights and fp32 gradient accumulation: the master is the weight buffer itself."""
        precision = self.context.precision
        return precision.param_dtype == precision.master_dtype == precision.grad_accum_dtype

    def gather(self, buffer: torch.Tensor, low: int, high: int, dist_context=None) -> None:
        pass


class Sharded(Replicated):
    """Each rank's master covers ``partition_range(rank)`` of its group."""

    sharded = True

    def count(self, dist_context=None) -> int:
        """Partitions of a group over ``dist_context``'s ranks (None: the data-parallel ranks)."""
        return (dist_context or self.context.dist_context).world_size

    def bounds(self, group: ParamGroup) -> tuple[int, int]:
        return group.layout.partition_range((group.dist_context or self.context.dist_context).rank)

    def may_alias(self) -> bool:
        """fp32 weights: the master is this rank's slice of the weight buffer."""
        precision = self.context.precision
        return precision.param_dtype == precision.master_dtype

    def gather(self, buffer: torch.Tensor, low: int, high: int, dist_context=None) -> None:
        """Every rank's updated partition into every rank's buffer, ``allgather_bucket_size`` at a time
        (over ``dist_context``'s ranks; None: the data-parallel ranks)."""
        dist_context = dist_context or self.context.dist_context
        if dist_context.world_size == 1:
            return
        partition_numel = high - low
        chunk = max(1, int(self.context.config.zero_optimization.allgather_bucket_size))
        if chunk >= partition_numel:
            all_gather_into(buffer, buffer[low:high].clone(), dist_context)
            return
        for start in range(0, partition_numel, chunk):
            count = min(chunk, partition_numel - start)
            gathered = torch.empty(dist_context.world_size * count, dtype=buffer.dtype, device=buffer.device)
            all_gather_into(gathered, buffer[low + start:low + start + count].clone(), dist_context)
            for rank in range(dist_context.world_size):
                offset = rank * partition_numel + start
                buffer[offset:offset + count].copy_(gathered[rank * count:(rank + 1) * count])

"""ZeRO stage 1: optimizer state partitioned; whole gradients accumulate on every rank and are
reduced to their owners on the boundary, where the owner's slice of the gradient buffer becomes
its master grad."""
from __future__ import annotations

import torch

from launcher.zero.stages.sharding import Sharded
from launcher.zero.stages.reduction import WholeGradients
from launcher.zero.stages.whole_params import WholeParamsStrategy


class ReduceAtBoundary(WholeGradients):
    """On the boundary each bucket is reduced piecewise to the ranks owning it."""

    def send(self, position: int, start: int, chunk: torch.Tensor, work: torch.Tensor) -> None:
        strategy = self.strategy
        group = strategy.groups[position]
        low, _ = strategy.partitioning.bounds(group)
        buffer = self.grad_buffers[position].buffer

        def accumulate(offset, reduced):
            target = buffer[low + offset:low + offset + reduced.numel()]
            if reduced.data_ptr() != target.data_ptr():
                target.copy_(reduced)
            strategy.grad_ready(position, offset, target)   # reduced on the boundary only
        strategy.reduce_to_owners(group, work, start, accumulate)


class Stage1Strategy(WholeParamsStrategy):
    stage = 1
    partitioning_policy = Sharded
    reduction_policy = ReduceAtBoundary

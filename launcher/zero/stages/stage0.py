"""ZeRO stage 0 (data parallel): every rank holds everything; gradients all-reduced in buckets
while the boundary's backward runs. With fp32 training the masters are the weights themselves."""
from __future__ import annotations

import torch

from launcher.zero.distributed.collectives import all_reduce_async
from launcher.zero.stages.sharding import Replicated
from launcher.zero.stages.reduction import WholeGradients
from launcher.zero.stages.whole_params import WholeParamsStrategy


class AllReduce(WholeGradients):
    """Whole gradients on every rank, all-reduced bucket by bucket on the boundary."""

    def arms_on_boundary(self) -> bool:
        return self.strategy.communicates   # an optimizer that communicates itself gets local grads

    def send(self, position: int, start: int, chunk: torch.Tensor, work: torch.Tensor) -> None:
        strategy = self.strategy
        handle = all_reduce_async(work, strategy.groups[position].dist_context)

        def done():
            if strategy.post_scale != 1.0:
                work.mul_(strategy.post_scale)
            if work is not chunk:
                chunk.copy_(work)
        strategy.pending.append((handle, done))


class Stage0Strategy(WholeParamsStrategy):
    stage = 0
    partitioning_policy = Replicated
    reduction_policy = AllReduce

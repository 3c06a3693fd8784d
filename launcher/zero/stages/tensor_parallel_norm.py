"""The global gradient norm under tensor parallelism, for any ZeRO stage over the data axis.

A stage's own norm sums its master grads over the data-parallel group. With tensor parallelism
the tensor-parallel shards (``tensor_model_parallel`` parameters) must also be summed over the
tensor group, while replicated parameters (biases of row-parallel layers, norms) are counted once:
so the squares are split by parameter through the stage's fragments, and an overflow on any
tensor rank skips the step on all of them.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from launcher.zero.stages.base import GradStats


def with_tensor_parallel_norm(strategy_cls: type, model_group, sharded_names: set[str]) -> type:
    """A subclass of ``strategy_cls`` whose ``grad_norm_and_overflow`` spans the data and tensor axes."""

    class TensorParallelStrategy(strategy_cls):
        def grad_square_sum(self):
            return None   # two axes: the engine asks grad_norm_and_overflow below

        def grad_norm_and_overflow(self) -> GradStats:
            device = self.context.dist_context.device
            totals = torch.zeros(3, dtype=torch.float64, device=device)   # sharded, replicated, non-finite
            # stage 3 keeps small ("persistent") parameters whole on every data rank: count them on one
            whole = {slot.name for slots in getattr(self, "group_slots", ()) for slot in slots if slot.persistent}
            for fragment in self.fragments():
                if fragment.name in whole and self.context.dist_context.rank != 0:
                    continue
                grad = fragment.master.grad
                if grad is None or fragment.numel == 0:
                    continue
                piece = grad.detach().reshape(-1)[fragment.master_offset:fragment.master_offset + fragment.numel]
                finite = bool(torch.isfinite(piece).all())
                totals[2] += 0.0 if finite else 1.0
                if finite:
                    totals[0 if fragment.name in sharded_names else 1] += piece.double().pow(2).sum()
            if self.partitioned_grads and self.context.dist_context.world_size > 1:
                dist.all_reduce(totals, group=self.context.dist_context.group)
            sharded = totals.clone()
            sharded[1] = 0.0                      # replicated squares are the same on every tensor rank
            dist.all_reduce(sharded, group=model_group)
            overflow = bool(sharded[2] > 0)
            norm = float("inf") if overflow else float((sharded[0] + totals[1]).sqrt())
            return GradStats(norm=norm, overflow=overflow)

    TensorParallelStrategy.__name__ = f"TensorParallel{strategy_cls.__name__}"
    return TensorParallelStrategy


def sharded_parameter_names(module: torch.nn.Module) -> set[str]:
    return {name for name, param in module.named_parameters() if getattr(param, "tensor_model_parallel", False)}

"""The global gradient norm under tensor parallelism, for any ZeRO stage over the data axis.

A stage's own norm sums its master grads over the data-parallel group. With tensor parallelism
the tensor-parallel shards (``tensor_model_parallel`` parameters) must also be summed over the
tensor group, while replicated parameters (biases of row-parallel layers, norms) are counted once:
so the squares are split by parameter through the stage's fragments, and an overflow on any
tensor rank skips the step on all of them. The pipeline engine's norm is the same sum over one
more axis (its stages): ``add_squares`` and ``tensor_parallel_stats`` serve both.

No host sync per tensor: each tensor's squares and its non-finite flag are added on the device
(a non-finite tensor's squares too, which only an overflow reads, and an overflow's norm is
inf); ``tensor_parallel_stats`` reads the totals once.
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
                add_squares(totals, piece, fragment.name in sharded_names)
            if self.partitioned_grads and self.context.dist_context.world_size > 1:
                dist.all_reduce(totals, group=self.context.dist_context.group)
            return tensor_parallel_stats(totals, model_group)

    TensorParallelStrategy.__name__ = f"TensorParallel{strategy_cls.__name__}"
    return TensorParallelStrategy


def add_squares(totals: torch.Tensor, grad: torch.Tensor, sharded: bool) -> None:
    """Add ``grad``'s squares to ``totals`` (float64: sharded, replicated, non-finite count) on the
    device, without a host sync."""
    totals[2] += (~torch.isfinite(grad).all()).to(totals.dtype)
    totals[0 if sharded else 1] += grad.double().pow(2).sum()


def tensor_parallel_stats(totals: torch.Tensor, model_group, pipe_group=None) -> GradStats:
    """The global norm from this rank's ``totals`` (summed over the data axis where that is partitioned):
    the sharded squares and the non-finite count summed over the tensor group (``model_group``; None:
    one tensor rank), replicated squares counted once, then everything summed over the pipeline's
    stages (``pipe_group``; None: one stage). One host sync: the overflow flag (and the norm)."""
    if model_group is not None:
        sharded = totals.clone()
        sharded[1] = 0.0                      # replicated squares are the same on every tensor rank
        dist.all_reduce(sharded, group=model_group)
        totals = torch.stack([sharded[0], totals[1], sharded[2]])
    if pipe_group is not None:
        dist.all_reduce(totals, group=pipe_group)
    overflow = bool(totals[2] > 0)
    norm = float("inf") if overflow else float((totals[0] + totals[1]).sqrt())
    return GradStats(norm=norm, overflow=overflow)


def sharded_parameter_names(module: torch.nn.Module) -> set[str]:
    return {name for name, param in module.named_parameters() if getattr(param, "tensor_model_parallel", False)}

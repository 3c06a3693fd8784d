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

Every stage asks for this norm when its layout's tensor axis is larger than 1
(``ZeroStrategy.grad_norm_and_overflow``); the groups come from the layout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import torch
import torch.distributed as dist

if TYPE_CHECKING:  # pragma: no cover
    from launcher.zero.distributed.parallel_layout import ParallelLayout


@dataclass(frozen=True)
class GradStats:
    """Global gradient statistics of one step, identical on every rank."""

    norm: float               # L2 norm over all master grads (still times the loss scale)
    overflow: bool            # an inf or NaN anywhere on any rank


def tensor_parallel_grad_stats(fragments: Iterable, whole: set[str], partitioned_grads: bool,
                               parallel: "ParallelLayout") -> GradStats:
    """The norm of a stage's master grads (``fragments``) over the data and tensor axes of ``parallel``.

    ``whole``: parameters every data rank holds whole (stage 3's persistent ones), counted on the
    first data rank only; ``partitioned_grads``: each data rank holds its partition, so the squares
    are summed over the data axis first."""
    data = parallel.data
    totals = torch.zeros(3, dtype=torch.float64, device=data.device)   # sharded, replicated, non-finite
    sharded_names = parallel.tensor_sharded_names
    for fragment in fragments:
        if fragment.name in whole and data.rank != 0:
            continue
        grad = fragment.master.grad
        if grad is None or fragment.numel == 0:
            continue
        piece = grad.detach().reshape(-1)[fragment.master_offset:fragment.master_offset + fragment.numel]
        add_squares(totals, piece, fragment.name in sharded_names)
    if partitioned_grads and data.world_size > 1:
        dist.all_reduce(totals, group=parallel.group("data"))
    return tensor_parallel_stats(totals, parallel.group("tensor"))


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

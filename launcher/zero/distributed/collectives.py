"""Thin wrappers over torch.distributed that hide version differences and dtype changes."""
from __future__ import annotations

import torch
import torch.distributed as dist

from launcher.zero.distributed.context import DistContext


def all_gather_single(output: torch.Tensor, shard: torch.Tensor, group=None, async_op: bool = False):
    """torch's fused all-gather into one tensor, by either of its names: ``all_gather_single`` from
    torch 2.13, ``all_gather_into_tensor`` before it (torch 2.4-2.12, which we still support)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(output, shard, group=group, async_op=async_op)


def reduce_scatter_single(output: torch.Tensor, whole: torch.Tensor, group=None, async_op: bool = False):
    """torch's fused reduce-scatter from one tensor, by either of its names (as all_gather_single)."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, whole, group=group, async_op=async_op)


def all_gather_into(output: torch.Tensor, shard: torch.Tensor, ctx: DistContext) -> None:
    """Concatenate every rank's equal-size ``shard`` into ``output`` (rank order)."""
    if ctx.world_size == 1:
        output.copy_(shard)
        return
    all_gather_single(output, shard.contiguous(), group=ctx.group)


def all_reduce_async(tensor: torch.Tensor, ctx: DistContext):
    """Sum ``tensor`` over the group in place; returns a work handle (or None at world size 1)."""
    if ctx.world_size == 1:
        return None
    return dist.all_reduce(tensor, group=ctx.group, async_op=True)


def reduce_async(tensor: torch.Tensor, owner: int, ctx: DistContext):
    """Sum ``tensor`` into rank ``owner``'s copy; other ranks' copies are left undefined."""
    if ctx.world_size == 1:
        return None
    dst = owner if ctx.group is None else dist.get_global_rank(ctx.group, owner)
    return dist.reduce(tensor, dst=dst, group=ctx.group, async_op=True)


def broadcast_from(tensor: torch.Tensor, group_rank: int = 0, group=None) -> None:
    """Overwrite ``tensor`` on every rank of ``group`` (None: the default group) with the copy of
    the group's rank ``group_rank`` (the first rank unless told)."""
    src = group_rank if group is None else dist.get_global_rank(group, group_rank)
    dist.broadcast(tensor, src=src, group=group)


def broadcast_module_from_first(module: torch.nn.Module, ctx: DistContext) -> None:
    """Give every rank the parameters and buffers of the group's rank 0 (DeepSpeed does this at
    ``initialize`` at every stage, so per-rank seeds still train one model)."""
    if ctx.world_size == 1:
        return
    tensors = list(dict.fromkeys(module.parameters())) + list(dict.fromkeys(module.buffers()))
    with torch.no_grad():
        for tensor in tensors:
            broadcast_from(tensor.data, group=ctx.group)


def wait(handles) -> None:
    for handle in handles:
        if handle is not None:
            handle.wait()


def gradient_scales(config, world_size: int) -> tuple[float, float]:
    """(factor before, factor after) the sum-reduction, DeepSpeed's pre/postscale rule."""
    if config.gradient_allreduce_op == "sum":
        return 1.0, 1.0
    if config.prescale_gradients:
        return 1.0 / world_size, 1.0
    predivide = config.gradient_predivide_factor
    return 1.0 / predivide, predivide / world_size

"""The four Megatron region functions: autograd-aware collectives over the tensor-parallel group.

``copy_to`` (identity forward, all-reduce backward) opens a tensor-parallel region, ``reduce_from``
(all-reduce forward, identity backward) closes it; ``gather_from`` / ``scatter_to`` move between a
split last dimension and the whole tensor.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _size(group) -> int:
    return dist.get_world_size(group)


def _gather_last(tensor: torch.Tensor, group) -> torch.Tensor:
    pieces = [torch.empty_like(tensor) for _ in range(_size(group))]
    dist.all_gather(pieces, tensor.contiguous(), group=group)
    return torch.cat(pieces, dim=-1)


def _split_last(tensor: torch.Tensor, group) -> torch.Tensor:
    return tensor.chunk(_size(group), dim=-1)[dist.get_rank(group)].contiguous()


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        out = tensor.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _gather_last(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad, ctx.group), None


class _ScatterTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _split_last(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.group), None


def copy_to(tensor, group):
    return _CopyTo.apply(tensor, group) if _size(group) > 1 else tensor


def reduce_from(tensor, group):
    return _ReduceFrom.apply(tensor, group) if _size(group) > 1 else tensor


def gather_from(tensor, group):
    return _GatherFrom.apply(tensor, group) if _size(group) > 1 else tensor


def scatter_to(tensor, group):
    return _ScatterTo.apply(tensor, group) if _size(group) > 1 else tensor

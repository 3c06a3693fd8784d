"""Sequence parallelism (Megatron's): between tensor-parallel regions, activations are split along
the sequence across the tensor group, so layer norms, dropout and residuals run on 1/tensor of it.

Four autograd-aware moves along the sequence dimension (``dim``, 1 for ``[batch, seq, hidden]``):

================================  ======================  ==========================
function                          forward                 backward
================================  ======================  ==========================
``gather_sequence_for_column``    all-gather              reduce-scatter
``reduce_scatter_sequence``       reduce-scatter          all-gather
``scatter_sequence``              keep this rank's slice  all-gather
``gather_sequence``               all-gather              keep this rank's slice
================================  ======================  ==========================

The first opens a column-parallel linear (its input is needed whole; each rank's input gradient is
a partial sum over its output columns), the second closes a row-parallel one (its partial products
are summed and split in one collective instead of an all-reduce). A model calls ``scatter_sequence``
where it enters the sequence-parallel part (after the embedding) and ``gather_sequence`` where it
leaves it (before a head that wants the whole sequence; the gradient there is the same on every
tensor rank, so each keeps its slice).

Parameters used on the local slice (a layer norm's, a row-parallel bias) are replicated but each
rank sees only its part of the sequence, so their gradients are summed over the tensor group:
``replicated_on_sequence`` is the identity forward and an all-reduce of the gradient backward,
applied to the parameter inside ``forward``; every tensor rank then holds the same full gradient,
which the clip norm counts once like any replicated parameter.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from launcher.zero.errors import ConfigError
from launcher.zero.parallel.regions import copy_to

#: process-group backends seen without reduce_scatter (older gloo): all-reduce and keep a slice there
_NO_REDUCE_SCATTER: set[str] = set()


def _size(group) -> int:
    return dist.get_world_size(group)


def _check_divides(tensor: torch.Tensor, dim: int, group) -> None:
    if tensor.shape[dim] % _size(group):
        raise ConfigError(f"sequence parallelism: the sequence (dim {dim}) has {tensor.shape[dim]} positions, "
                          f"which {_size(group)} tensor-parallel ranks do not divide",
                          hint="pad or choose a sequence length that is a multiple of the tensor size")


def _all_gather(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    pieces = [torch.empty_like(tensor) for _ in range(_size(group))]
    dist.all_gather(pieces, tensor.contiguous(), group=group)
    return torch.cat(pieces, dim=dim)


def _split(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    _check_divides(tensor, dim, group)
    return tensor.chunk(_size(group), dim=dim)[dist.get_rank(group)].contiguous()


def _reduce_scatter(tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    _check_divides(tensor, dim, group)
    pieces = [piece.contiguous() for piece in tensor.chunk(_size(group), dim=dim)]
    backend = str(dist.get_backend(group))
    if backend not in _NO_REDUCE_SCATTER:
        out = torch.empty_like(pieces[0])
        try:
            dist.reduce_scatter(out, pieces, group=group)
            return out
        except (RuntimeError, NotImplementedError) as error:
            if "support" not in str(error).lower():
                raise
            _NO_REDUCE_SCATTER.add(backend)
    whole = tensor.contiguous().clone()
    dist.all_reduce(whole, group=group)
    return _split(whole, dim, group)


def _move(name: str, forward, backward) -> type:
    """An autograd function whose forward is one sequence move and whose backward is its adjoint."""
    def fwd(ctx, tensor, group, dim):
        ctx.group, ctx.dim = group, dim
        return forward(tensor, dim, group)

    def bwd(ctx, grad):
        return backward(grad, ctx.dim, ctx.group), None, None

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})


_GatherForColumn = _move("_GatherForColumn", _all_gather, _reduce_scatter)
_ReduceScatter = _move("_ReduceScatter", _reduce_scatter, _all_gather)
_Scatter = _move("_Scatter", _split, _all_gather)
_Gather = _move("_Gather", _all_gather, _split)


def gather_sequence_for_column(tensor, group, dim: int = 1):
    """The whole sequence for a column-parallel linear; backward sums the partial input grads and splits."""
    return _GatherForColumn.apply(tensor, group, dim) if _size(group) > 1 else tensor


def reduce_scatter_sequence(tensor, group, dim: int = 1):
    """A row-parallel linear's partial products summed over the group, each rank keeping its slice."""
    return _ReduceScatter.apply(tensor, group, dim) if _size(group) > 1 else tensor


def scatter_sequence(tensor, group, dim: int = 1):
    """This rank's slice of a tensor that is whole (and equal) on every tensor rank."""
    return _Scatter.apply(tensor, group, dim) if _size(group) > 1 else tensor


def gather_sequence(tensor, group, dim: int = 1):
    """The whole sequence from every rank's slice, for work that is then the same on every tensor rank."""
    return _Gather.apply(tensor, group, dim) if _size(group) > 1 else tensor


def replicated_on_sequence(param, group):
    """``param`` as it is; its gradient (from this rank's slice of the sequence) summed over the group."""
    return copy_to(param, group) if param is not None else None


def mark_sequence_parallel(param: nn.Parameter | None) -> None:
    """Megatron's attribute: a replicated parameter whose gradient is summed over the tensor group."""
    if param is not None:
        param.sequence_parallel = True


def _adopt(new: nn.Module, norm: nn.Module, group) -> nn.Module:
    """`new` takes `norm`'s values and the tensor group; its parameters are marked replicated."""
    new.load_state_dict(norm.state_dict())
    new.group = group
    for param in new.parameters():
        mark_sequence_parallel(param)
    return new


class SequenceParallelLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` on this rank's slice of the sequence; same parameter names, gradients summed."""

    group = None

    @classmethod
    def from_norm(cls, norm: nn.LayerNorm, group) -> "SequenceParallelLayerNorm":
        new = cls(norm.normalized_shape, eps=norm.eps, elementwise_affine=norm.elementwise_affine,
                  bias=norm.bias is not None, device=norm.weight.device if norm.weight is not None else None,
                  dtype=norm.weight.dtype if norm.weight is not None else None)
        return _adopt(new, norm, group)

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, replicated_on_sequence(self.weight, self.group),
                            replicated_on_sequence(self.bias, self.group), self.eps)


class SequenceParallelRMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` on this rank's slice of the sequence; same parameter names, gradients summed."""

    group = None

    @classmethod
    def from_norm(cls, norm: nn.RMSNorm, group) -> "SequenceParallelRMSNorm":
        new = cls(norm.normalized_shape, eps=norm.eps, elementwise_affine=norm.elementwise_affine,
                  device=norm.weight.device if norm.weight is not None else None,
                  dtype=norm.weight.dtype if norm.weight is not None else None)
        return _adopt(new, norm, group)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, replicated_on_sequence(self.weight, self.group), self.eps)

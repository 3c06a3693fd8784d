"""Stage 3's two collectives, with a fallback for backends that lack the fused tensor forms.

Older gloo builds do not implement ``all_gather_into_tensor`` / ``reduce_scatter_tensor``; there
the same results come from list all-gather and all-reduce (more traffic, same numbers). The
first failure is remembered per backend so the fast path is not retried every call.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from launcher.zero.distributed.collectives import all_gather_single, reduce_scatter_single

_UNSUPPORTED: set[tuple[str, str]] = set()


def _backend(group) -> str:
    return str(dist.get_backend(group))


def _fallback_needed(error: Exception) -> bool:
    text = str(error).lower()
    return isinstance(error, (NotImplementedError, RuntimeError)) and ("support" in text or "implement" in text)


def _fused(name: str, fused, group, *args, async_op: bool):
    """(True, work handle or None) from the fused collective, or (False, None) when this backend
    lacks it (remembered, so it is tried once per backend)."""
    key = (_backend(group), name)
    if key in _UNSUPPORTED:
        return False, None
    try:
        return True, fused(*args, group=group, async_op=async_op)
    except Exception as error:  # noqa: BLE001 - re-raised unless it says "unsupported"
        if not _fallback_needed(error):
            raise
        _UNSUPPORTED.add(key)
        return False, None


def all_gather_shard(buffer: torch.Tensor, shard: torch.Tensor, group, async_op: bool):
    """Every rank's equal-size ``shard`` into ``buffer`` (rank order); returns a work handle or None."""
    done, work = _fused("all_gather", all_gather_single, group, buffer, shard, async_op=async_op)
    if done:
        return work
    dist.all_gather(list(buffer.chunk(dist.get_world_size(group))), shard, group=group)
    return None


def reduce_scatter_shard(out: torch.Tensor, padded: torch.Tensor, group, async_op: bool):
    """Sum ``padded`` over the ranks and keep this rank's equal slice in ``out``; work handle or None."""
    done, work = _fused("reduce_scatter", reduce_scatter_single, group, out, padded, async_op=async_op)
    if done:
        return work
    dist.all_reduce(padded, group=group)
    rank = dist.get_rank(group)
    out.copy_(padded[rank * out.numel():(rank + 1) * out.numel()])
    return None

"""Partitioned parameters: each rank keeps one shard; the full tensor exists only while gathered.

A partitioned parameter keeps its identity (the same nn.Parameter object the module and the
optimizer know) and swaps its ``.data`` between an empty tensor (released) and a view of a
gathered full buffer (available). Its bookkeeping lives in a ``ShardState`` at ``param.ds_state``;
DeepSpeed's attribute names (``ds_numel``, ``ds_shape``, ``ds_tensor``) are set too, since user
code and libraries test for them.

Glossary. *shard*: rank r's slice ``[r*shard_numel, (r+1)*shard_numel)`` of the flattened
parameter padded to ``shard_numel*world_size`` (DeepSpeed's per-parameter stage-3 layout, which is
also what its zero_to_fp32 expects). *persistent*: a parameter below the persistence threshold,
kept whole on every rank and never partitioned.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from launcher.zero.stages.stage3.gather_scatter import all_gather_shard



class ZeroParamStatus(str, enum.Enum):
    """Where a partitioned parameter's full tensor is: DeepSpeed's names, kept in ``param.ds_status``."""

    AVAILABLE = "available"          # gathered: ``param.data`` is the full tensor
    NOT_AVAILABLE = "not_available"  # released: only the shard is held
    INFLIGHT = "inflight"            # an all-gather is under way


AVAILABLE, NOT_AVAILABLE, INFLIGHT = ZeroParamStatus.AVAILABLE, ZeroParamStatus.NOT_AVAILABLE, ZeroParamStatus.INFLIGHT
# DeepSpeed numbers partitioned parameters (``param.ds_id``); libraries test for the attribute
_next_id = itertools.count()


def shard_numel(numel: int, world_size: int) -> int:
    """Elements each rank holds for a parameter of ``numel`` elements (the last shard is padded)."""
    return max(1, -(-numel // world_size))


def shard_range(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """The unpadded part [start, end) of the flattened parameter that ``rank``'s shard covers."""
    size = shard_numel(numel, world_size)
    start = min(numel, rank * size)
    return start, min(numel, start + size)


@dataclass
class ShardState:
    """Where a partitioned parameter's pieces are, and how to bring them together."""

    shape: torch.Size
    numel: int
    shard: torch.Tensor               # this rank's shard, 1-D, length shard_numel (padded)
    group: Any                        # the process group the parameter is partitioned over
    rank: int
    world_size: int
    device: torch.device              # where the full parameter is computed with
    status: ZeroParamStatus = NOT_AVAILABLE
    buffer: torch.Tensor | None = None    # the gathered (padded) full tensor while available
    work: Any = None                  # the pending all-gather while inflight
    on_update: list[Callable[[torch.nn.Parameter], None]] = field(default_factory=list)
    before_read: Callable[[torch.nn.Parameter], None] | None = None   # overlap_step: wait for the update
    swap: Any = None                  # offload_param nvme: the file holding the shard (nvme_params.py)

    @property
    def shard_numel(self) -> int:
        return self.shard.numel()


def is_partitioned(param: torch.Tensor) -> bool:
    return getattr(param, "ds_state", None) is not None


def mark_persistent(param: torch.nn.Parameter) -> None:
    """Label a parameter stage 3 keeps whole on every rank (under the persistence thresholds) as
    DeepSpeed labels its persistent ones: ``ds_persist``, always ``AVAILABLE``, its full shape and size,
    an id. Libraries test these on every parameter at ZeRO-3 (TRL reads ``ds_status`` before it gathers)."""
    param.ds_persist, param.ds_status = True, AVAILABLE
    param.ds_shape, param.ds_numel = param.shape, param.numel()
    param.ds_id = next(_next_id)


def empty_like_param(param: torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=param.dtype, device=device)


def partition(param: torch.nn.Parameter, group: Any, rank: int, world_size: int, device: torch.device,
              shard_device: torch.device | None = None) -> ShardState:
    """Turn a whole parameter into a partitioned one: keep this rank's shard, free the rest.

    Every rank must hold the same full values (built with the same seed, or broadcast first).
    ``shard_device`` is where the shard is stored (the CPU with ``offload_param``).
    """
    full = param.data.reshape(-1)
    size = shard_numel(full.numel(), world_size)
    shard = torch.zeros(size, dtype=full.dtype, device=shard_device or device)
    start, end = shard_range(full.numel(), world_size, rank)
    if end > start:
        shard[: end - start].copy_(full[start:end])
    state = ShardState(shape=param.shape, numel=full.numel(), shard=shard, group=group, rank=rank,
                       world_size=world_size, device=torch.device(device))
    param.ds_state = state
    param.ds_shape, param.ds_numel, param.ds_tensor = state.shape, state.numel, shard
    param.ds_status = state.status
    param.ds_id = next(_next_id)
    param.data = empty_like_param(param, state.device)
    return state


def start_gather(param: torch.nn.Parameter, async_op: bool = False) -> None:
    """Begin the all-gather of a released parameter (no-op when available or already inflight)."""
    state: ShardState = param.ds_state
    if state.status != NOT_AVAILABLE:
        return
    if state.before_read is not None:
        state.before_read(param)
    source = shard_values(state, state.device).to(state.device, non_blocking=True)
    if state.world_size == 1:   # the shard is the whole parameter: no copy
        buffer, work = source, None
    else:
        buffer = torch.empty(state.shard_numel * state.world_size, dtype=source.dtype, device=state.device)
        work = all_gather_shard(buffer, source, state.group, async_op)
    state.buffer, state.work, state.status = buffer, (work if async_op else None), INFLIGHT
    param.ds_status = state.status


def finish_gather(param: torch.nn.Parameter) -> None:
    """Wait for an inflight all-gather and make the full parameter visible as ``param.data``."""
    state: ShardState = param.ds_state
    if state.status == AVAILABLE:
        return
    if state.status == NOT_AVAILABLE:
        start_gather(param)
    if state.work is not None:
        state.work.wait()
        state.work = None
    param.data = state.buffer[: state.numel].view(state.shape)
    state.status = param.ds_status = AVAILABLE


def gather(params: Iterable[torch.nn.Parameter]) -> None:
    """Make partitioned parameters whole: all-gathers issued together, then waited for."""
    todo = [p for p in params if is_partitioned(p) and p.ds_state.status != AVAILABLE]
    for p in todo:
        start_gather(p, async_op=True)
    for p in todo:
        finish_gather(p)


def release(param: torch.nn.Parameter) -> None:
    """Drop the full tensor of a partitioned parameter, keeping only the shard."""
    state: ShardState = param.ds_state
    if state.status == INFLIGHT and state.work is not None:
        state.work.wait()
    state.buffer, state.work, state.status = None, None, NOT_AVAILABLE
    param.ds_status = state.status
    param.data = empty_like_param(param, state.device)


def give_shape(param: torch.nn.Parameter) -> None:
    """Before autograd accumulates a gradient into a released parameter: give it its full shape.

    Autograd lays a new ``.grad`` out like the parameter, so a size-0 placeholder would fail;
    a zero-stride expansion of one element has the right shape and allocates nothing.
    """
    state: ShardState = param.ds_state
    if state.status != AVAILABLE:
        param.data = torch.empty(1, dtype=param.dtype, device=state.device).expand(state.shape)


def update_shard_from_full(param: torch.nn.Parameter, full: torch.Tensor) -> None:
    """Write this rank's slice of a full tensor into the shard (after a user changed the parameter)."""
    state: ShardState = param.ds_state
    flat = full.reshape(-1)
    start, end = shard_range(state.numel, state.world_size, state.rank)
    if end > start and state.swap is not None:
        state.swap.write(state, flat[start:end])
    elif end > start:
        state.shard[: end - start].copy_(flat[start:end])
    for callback in state.on_update:
        callback(param)


def shard_values(state: ShardState, device: torch.device | None = None) -> torch.Tensor:
    """The shard's values: the shard itself, or with offload_param nvme a copy read from its file
    (on ``device``, the CPU unless given)."""
    if state.swap is None:
        return state.shard
    return state.swap.read(state, device or torch.device("cpu"))


def full_numel(param: torch.Tensor) -> int:
    """The parameter's full size whether or not it is partitioned."""
    return param.ds_state.numel if is_partitioned(param) else param.numel()


def full_shape(param: torch.Tensor) -> torch.Size:
    return param.ds_state.shape if is_partitioned(param) else param.shape


def returned_params(output) -> dict[int, torch.nn.Parameter]:
    """The partitioned parameters among a module's outputs, looked for where DeepSpeed looks: the
    output itself, the items of a list or tuple, the values of a dict, an object's attributes."""
    if output is None:
        return {}
    if torch.is_tensor(output):
        items = (output,)
    elif isinstance(output, (list, tuple)):
        items = output
    elif isinstance(output, dict):
        items = output.values()
    else:
        items = vars(output).values() if hasattr(output, "__dict__") else ()
    return {id(item): item for item in items if getattr(item, "ds_state", None) is not None}

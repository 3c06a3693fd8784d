"""Pure bookkeeping of stage 3's per-group flat master: which parameter sits where.

Each optimizer group gets one flat fp32 master on this rank, laid out in group order: a
partitioned parameter contributes its shard (``shard_numel`` elements, padding included), a
persistent one its whole tensor. The gradient buffer has the same layout.
"""
from __future__ import annotations

from dataclasses import dataclass

from launcher.zero.stages.stage3.params import shard_numel, shard_range


@dataclass(frozen=True)
class Stage3Slot:
    """One parameter's place in its group's flat master on one rank."""

    name: str
    shape: tuple[int, ...]
    numel: int            # full parameter size
    persistent: bool      # kept whole on every rank
    offset: int           # first element in the flat master
    length: int           # elements the master holds for it (shard incl. padding, or numel)
    param_start: int      # first element of the flattened parameter covered here
    param_end: int        # one past the last (padding excluded)

    @property
    def covered(self) -> int:
        return self.param_end - self.param_start


def plan_group(names, shapes, persistent, world_size: int, rank: int) -> tuple[list[Stage3Slot], int]:
    """Slots of one group and the master's total length on ``rank``."""
    slots, offset = [], 0
    for name, shape, whole in zip(names, shapes, persistent):
        numel = 1
        for dim in shape:
            numel *= int(dim)
        if whole:
            length, start, end = numel, 0, numel
        else:
            length = shard_numel(numel, world_size)
            start, end = shard_range(numel, world_size, rank)
        slots.append(Stage3Slot(name=name, shape=tuple(int(d) for d in shape), numel=numel, persistent=whole,
                                offset=offset, length=length, param_start=start, param_end=end))
        offset += length
    return slots, offset


def choose_persistent(numels: list[int], threshold: int, model_budget: int) -> list[bool]:
    """Which parameters stay whole: those below ``threshold``, smallest first, within ``model_budget`` elements."""
    whole = [False] * len(numels)
    used = 0
    for index in sorted(range(len(numels)), key=lambda i: numels[i]):
        if numels[index] >= threshold or used + numels[index] > model_budget:
            break
        whole[index] = True
        used += numels[index]
    return whole

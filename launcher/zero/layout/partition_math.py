"""Pure partition math: where each parameter sits in a flat buffer and which rank owns what.

Glossary. *flat buffer*: the parameters of one optimizer group laid end to end (in
``named_parameters`` order), padded at the tail to a multiple of ``world_size``. *partition*:
rank r's equal, contiguous slice ``[r * partition_numel, (r + 1) * partition_numel)``; a partition
may cut a parameter anywhere. *bucket*: a contiguous range of whole parameters reduced in one
collective, formed in reverse parameter order because backward produces gradients back to front.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class ParamSlot:
    """One parameter's place in a flat buffer."""

    name: str
    offset: int
    numel: int
    shape: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.offset + self.numel


@dataclass(frozen=True)
class Piece:
    """The overlap of a parameter (or a range) with one rank's partition."""

    rank: int
    slot: int             # index into FlatLayout.slots (-1 for a bare range)
    flat_start: int       # first element in the flat buffer
    numel: int

    @property
    def flat_end(self) -> int:
        return self.flat_start + self.numel


@dataclass(frozen=True)
class FlatLayout:
    """A flat buffer over some parameters, partitioned over ``world_size`` ranks."""

    slots: tuple[ParamSlot, ...]
    numel: int            # sum of parameter sizes
    padded_numel: int     # numel rounded up to a multiple of world_size * alignment
    world_size: int

    @property
    def partition_numel(self) -> int:
        return self.padded_numel // self.world_size

    def partition_range(self, rank: int) -> tuple[int, int]:
        start = rank * self.partition_numel
        return start, start + self.partition_numel

    def split_by_owner(self, start: int, end: int) -> list[Piece]:
        """Cut the flat range [start, end) at partition boundaries: one piece per owning rank."""
        pieces = []
        size = self.partition_numel
        position = start
        while position < end:
            rank = position // size
            stop = min(end, (rank + 1) * size)
            pieces.append(Piece(rank=rank, slot=-1, flat_start=position, numel=stop - position))
            position = stop
        return pieces

    def pieces_of_rank(self, rank: int) -> list[Piece]:
        """The parts of parameters that fall into rank's partition, in flat order."""
        low, high = self.partition_range(rank)
        pieces = []
        for index, slot in enumerate(self.slots):
            start, end = max(low, slot.offset), min(high, slot.end)
            if start < end:
                pieces.append(Piece(rank=rank, slot=index, flat_start=start, numel=end - start))
        return pieces


def flat_layout(names: Sequence[str], shapes: Sequence[Sequence[int]], world_size: int,
                alignment: int = 1) -> FlatLayout:
    """Lay parameters end to end and pad so that every rank's partition has the same size."""
    if world_size < 1 or alignment < 1:
        raise ValueError("world_size and alignment must be >= 1")
    slots, offset = [], 0
    for name, shape in zip(names, shapes):
        numel = 1
        for dim in shape:
            numel *= int(dim)
        slots.append(ParamSlot(name=name, offset=offset, numel=numel, shape=tuple(int(d) for d in shape)))
        offset += numel
    unit = world_size * alignment
    padded = max(unit, -(-offset // unit) * unit)
    return FlatLayout(slots=tuple(slots), numel=offset, padded_numel=padded, world_size=world_size)


@dataclass(frozen=True)
class Bucket:
    """Whole parameters ``slots[first:last]`` (flat range [start, end)) reduced together."""

    first: int
    last: int
    start: int
    end: int

    @property
    def numel(self) -> int:
        return self.end - self.start


def plan_buckets(layout: FlatLayout, bucket_numel: int) -> list[Bucket]:
    """Buckets of at least ``bucket_numel`` elements (but whole parameters), last parameter first."""
    buckets: list[Bucket] = []
    last = len(layout.slots)
    index = last
    while index > 0:
        index -= 1
        size = layout.slots[last - 1].end - layout.slots[index].offset
        if size >= bucket_numel or index == 0:
            buckets.append(Bucket(first=index, last=last, start=layout.slots[index].offset,
                                  end=layout.slots[last - 1].end))
            last = index
    return buckets


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """DeepSpeed's ``partition_uniform``: ``num_parts + 1`` boundaries, part p covering
    ``[parts[p], parts[p + 1])``, equal counts with the first ``num_items % num_parts`` parts one
    larger (a pipeline's layers per stage; TiledLinear's features per tile)."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    base, extra = divmod(num_items, num_parts)
    parts = [0]
    for p in range(num_parts):
        parts.append(parts[-1] + base + (1 if p < extra else 0))
    return parts

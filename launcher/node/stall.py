"""``--stall_timeout``: find the rank that stopped making progress while its peers went on.

Each rank of a node rewrites a small file (launcher/zero/progress.py: ``"<events> <step>"``);
the node's supervisor reads them and feeds a StallWatch, which is pure (the clock comes in).
A rank is stuck when others have passed its count of events for ``timeout`` seconds and it
has not moved since: the peers that went on now wait for it in a collective. A job in which
every rank stopped alike (all at the same count) is not a straggler and is not reported here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

PROGRESS_VARIABLE = "DSLAUNCH_PROGRESS_FILE"   # the rank side: launcher/zero/progress.py


@dataclass(frozen=True)
class Stall:
    """The stuck rank, where it is (its step), how long the others have been past it."""

    rank: int
    step: int
    behind_s: float
    others_step: int


@dataclass
class _Seen:
    events: int
    step: int
    since: float        # when this count was first seen


class StallWatch:
    """Fed (rank, events, step) readings with a time; ``stuck(now)`` names the straggler, if any."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.seen: dict[int, _Seen] = {}
        self.first_past: dict[int, float] = {}   # events count -> when a rank was first seen past it

    def observe(self, rank: int, events: int, step: int, now: float) -> None:
        old = self.seen.get(rank)
        if old is None or events != old.events:
            self.seen[rank] = _Seen(events, step, now)
            for count in range(old.events if old is not None else 0, events):
                self.first_past.setdefault(count, now)

    def stuck(self, now: float) -> Stall | None:
        if len(self.seen) < 2:
            return None
        lead = max(seen.events for seen in self.seen.values())
        candidates = []
        for rank, seen in self.seen.items():
            if seen.events >= lead:
                continue
            passed = self.first_past.get(seen.events)
            if passed is None:
                continue
            behind = now - max(passed, seen.since)
            if behind >= self.timeout_s:
                candidates.append((seen.events, -behind, rank))
        if not candidates:
            return None
        _events, minus_behind, rank = min(candidates)   # the furthest behind
        others = max(seen.step for r, seen in self.seen.items() if r != rank)
        return Stall(rank=rank, step=self.seen[rank].step, behind_s=-minus_behind, others_step=others)


def read_progress(path: str) -> tuple[int, int] | None:
    """(events, step) from a rank's progress file; None before its first report."""
    try:
        with open(path, "rb") as handle:
            fields = handle.read(64).split()
    except OSError:
        return None
    if len(fields) < 2:
        return None
    try:
        return int(fields[0]), int(fields[1])
    except ValueError:
        return None


def progress_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank_{rank}.progress")

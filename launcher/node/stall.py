"""``--stall_timeout``: find the rank that stopped making progress while its peers went on.

Each rank of a node rewrites a small file (launcher/zero/stall_beat.py: ``"<events> <step>"``);
the node's supervisor reads them. A StallWatch, pure (the clock comes in), judges where every
rank of the job is seen: in dslaunch (launcher/control/stalls.py, fed by the agents' reports)
or, under the local runner, in the supervisor itself. A rank is stuck when others have passed
its count of events for ``timeout`` seconds and it has not moved since: the peers that went on
now wait for it in a collective. A job in which every rank stopped alike (all at the same
count) is not a straggler: QuietWatch finds it instead (no progress and no output from any rank
for ``timeout`` seconds), and launcher/node/hang.py names the cause from every rank's stack.
"""
from __future__ import annotations

import bisect
import os
import shutil
import tempfile
from dataclasses import dataclass

PROGRESS_VARIABLE = "DSLAUNCH_PROGRESS_FILE"   # the rank side: launcher/zero/stall_beat.py
PROGRESS_PREFIX = "dslaunch-progress-"   # + the pid of the launcher or agent that owns the folder


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
    """Fed (rank, events, step) readings with a time; ``stuck(now)`` names the straggler, if any.

    Memory stays bounded on a long job: the lead's history (when the most advanced rank first
    passed each count) is kept only above the count of the rank furthest behind.
    """

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.seen: dict[int, _Seen] = {}
        self.lead_history: list[tuple[int, float]] = []   # (lead events, when reached), lead increasing

    def observe(self, rank: int, events: int, step: int, now: float) -> bool:
        """Take a reading; True when the rank's count moved (or is new): progress."""
        old = self.seen.get(rank)
        if old is not None and events < old.events:   # a new process counts from 0 again: a restart
            self.seen.clear()
            self.lead_history.clear()
            old = None
        if old is None or events != old.events:
            if old is None:
                self.seen[rank] = _Seen(events, step, now)
            else:   # in place: dslaunch observes up to every rank of the job each second
                old.events, old.step, old.since = events, step, now
            if not self.lead_history or events > self.lead_history[-1][0]:
                self.lead_history.append((events, now))
            return True
        return False

    def _first_past(self, events: int) -> float | None:
        """When some rank was first seen with more than `events` events (None: none has been)."""
        index = bisect.bisect_right(self.lead_history, events, key=lambda entry: entry[0])
        return self.lead_history[index][1] if index < len(self.lead_history) else None

    def behind(self, now: float) -> list[Stall]:
        """Every rank the others have been past for the timeout while it did not move, furthest behind first."""
        if len(self.seen) < 2:
            return []
        lowest = min(seen.events for seen in self.seen.values())
        # entries at or below every rank's count are not asked again by the ranks seen so far; the
        # last one (the lead) stays: a rank whose first reading comes later, below the lead, reads
        # it as when the others were past it at the latest (a slow agent must not hide its rank)
        keep = bisect.bisect_right(self.lead_history, lowest, key=lambda entry: entry[0])
        del self.lead_history[:min(keep, len(self.lead_history) - 1)]
        found = []
        for rank, seen in self.seen.items():
            if now - seen.since < self.timeout_s:   # it moved lately: not stuck, whatever the others did
                continue
            passed = self._first_past(seen.events)
            if passed is None:
                continue
            behind = now - max(passed, seen.since)
            if behind >= self.timeout_s:
                found.append((seen.events, -behind, rank))
        if not found:
            return []
        top = sorted(((seen.step, rank) for rank, seen in self.seen.items()), reverse=True)[:2]
        stalls = []
        for _events, minus_behind, rank in sorted(found):
            others = top[1][0] if top[0][1] == rank else top[0][0]   # the furthest step of any other rank
            stalls.append(Stall(rank=rank, step=self.seen[rank].step, behind_s=-minus_behind, others_step=others))
        return stalls

    def stuck(self, now: float) -> Stall | None:
        stalls = self.behind(now)
        return stalls[0] if stalls else None


class QuietWatch:
    """The job as a whole: when anything was last seen of any rank (a count moved, a line of output).

    Its clock starts at the first sign of life, not at the launch: a start-up (imports, a model
    download, the rendezvous) shows nothing to judge, and a long silent one must not be taken for
    a hang. ``quiet_for(now)`` is then the seconds since the last sign; pure, the clock comes in."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.last: float | None = None

    def saw(self, now: float) -> None:
        self.last = now if self.last is None else max(self.last, now)

    def quiet_for(self, now: float) -> float:
        return 0.0 if self.last is None else now - self.last

    def quiet(self, now: float) -> bool:
        return self.quiet_for(now) >= self.timeout_s


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


def describe_stall(stall: Stall, host: str, timeout_s: float, whole_node: bool = False) -> str:
    """The one line that names a stuck rank: where, at which step, for how long, and what comes next."""
    where = f"rank {stall.rank}" + (f" on {host}" if host else "")
    step = f"after step {stall.step}" if stall.step >= 0 else "in its first step"
    went = "in the same step" if stall.others_step == stall.step else f"to step {stall.others_step}"
    node = f" (so is every other rank on {host}: the whole node stopped)" if whole_node else ""
    return (f"{where} is stuck {step}{node}: no progress for {stall.behind_s:.0f} s while the other ranks went on "
            f"({went}; --stall_timeout {timeout_s:g}); "
            f"the Python stack of every rank{' on ' + host if host else ''} follows")


def sweep_progress_dirs(root: str) -> None:
    """Remove the progress folders (PROGRESS_PREFIX + pid) left by launchers that were SIGKILLed.

    A folder is named for the process that made it; one whose process is gone is removed (its
    ranks died with the job); one whose process still runs, or that another user owns, is kept."""
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid = name[len(PROGRESS_PREFIX):].split("-", 1)[0]
        if not name.startswith(PROGRESS_PREFIX) or not pid.isdigit() or _alive(int(pid)):
            continue
        path = os.path.join(root, name)
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)


def make_progress_dir(root: str) -> str:
    """A fresh folder for this process's ranks' progress files, named for its pid (see sweep_progress_dirs)."""
    sweep_progress_dirs(root)
    return tempfile.mkdtemp(prefix=f"{PROGRESS_PREFIX}{os.getpid()}-", dir=root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True

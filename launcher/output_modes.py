"""Which rank lines dslaunch prints (`--output all|rank0|failures|none`) and the summary of the rest.

With hundreds of nodes, every rank's every line on one console is unreadable and costs the
controller a core. The modes:

  all       every rank's lines, prefixed `[rank N]` (the default; as before)
  rank0     rank 0's lines only
  failures  rank 0's lines; another rank's lines are held, and when it fails its last lines
            are printed
  none      no rank lines; only dslaunch's own messages (the failure summary included)

Held lines are counted; the job ends with one line saying how many and where the full logs
are (`--log_dir`). Pure: the controller, the local supervisor and the agents (which do not
send what will not be shown) ask the same questions.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

MODES = ("all", "rank0", "failures", "none")
DEFAULT_MODE = "all"


def shows(mode: str, rank: int) -> bool:
    """Whether a line of `rank` goes to the console as it comes."""
    if mode == "all":
        return True
    if mode in ("rank0", "failures"):
        return rank == 0
    return False


def releases_tail(mode: str, rank: int, returncode: int, stopping: bool) -> bool:
    """Whether a rank's exit prints its held last lines: under `failures`, when it failed by
    itself (not when it was killed by the stop that followed another rank's failure)."""
    if mode != "failures" or shows(mode, rank) or returncode == 0:
        return False
    return returncode > 0 or not stopping


def summary(mode: str, held: int, log_dir: str | None) -> str | None:
    """The closing line of a job whose output was filtered; None under `all`."""
    if mode == "all":
        return None
    where = (f"every rank's full log is in {log_dir}/rank_<R>.log on the rank's node" if log_dir
             else "pass --log_dir DIR to keep every rank's full log")
    lines = "line" if held == 1 else "lines"
    return f"--output {mode}: {held} rank output {lines} not shown; {where}"


@dataclass
class OutputFilter:
    """One job's filter: what to show, what was held, which failed ranks to print the tail of.

    `shows` and `add_held` may be called from several threads at once (every rank's two output
    threads on a node): the count is kept under a lock."""

    mode: str = DEFAULT_MODE
    held: int = 0
    _failed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def shows(self, rank: int) -> bool:
        if shows(self.mode, rank):
            return True
        self.add_held(1)
        return False

    def add_held(self, count: int) -> None:
        with self._lock:
            self.held += count

    def tail_to_print(self, rank: int, returncode: int, tail, stopping: bool = False) -> tuple[str, ...]:
        """The lines to print now for a rank that exited (empty for most exits)."""
        stopping = stopping or self._failed
        release = releases_tail(self.mode, rank, returncode, stopping)
        if returncode > 0 or (returncode < 0 and not stopping):
            self._failed = True   # later ranks killed by a signal were stopped, not failed
        return tuple(tail) if release else ()

    def summary(self, log_dir: str | None) -> str | None:
        return summary(self.mode, self.held, log_dir)

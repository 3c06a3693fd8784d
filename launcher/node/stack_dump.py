"""Take the Python stack of a node's ranks (``--stall_timeout``): SIGUSR1, then read the dump's file.

Under the stall watch the supervisor puts rank_site/ first on every rank's PYTHONPATH and names a
file per rank in ``DSLAUNCH_STACKS_FILE``; the rank's Python arms faulthandler there at start-up
(rank_site/sitecustomize.py). Asking is: find the process that armed it (its pid is in the file,
and must be in the rank's process tree: a pid reused by another process is never signalled),
send it SIGUSR1, wait until its file stops growing, read what was added.
"""
from __future__ import annotations

import dataclasses
import linecache
import os
import signal
import time
from dataclasses import dataclass

from launcher.node.process import RankProcess, process_tree
from launcher.node.stacks import KEPT_FRAMES, Frame, RankStack, armed, main_thread

STACKS_VARIABLE = "DSLAUNCH_STACKS_FILE"   # the rank side: rank_site/sitecustomize.py
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_site")
DUMP_WAIT_SECONDS = 3.0    # a dump that has not come by then is reported missing
SETTLED_SECONDS = 0.2      # a file unchanged this long after it grew holds the whole dump
SAMPLE_GAP_SECONDS = 1.0   # from the first to the last of the dumps that tell a busy rank from a hung one
CODE_CHARS = 160           # a frame's source line is cut here in the message


@dataclass(frozen=True)
class Dump:
    """What one rank's dump gave: its text (every thread), the main thread's id, or why there is none."""

    rank: int
    text: str = ""
    main_id: int | None = None
    note: str = ""

    def place(self) -> tuple[tuple[str, int, str], ...]:
        """Every frame of the main thread as (file, line, function): two dumps at one place are equal."""
        return tuple((f.file, f.line, f.function) for f in main_thread(self.text, self.main_id)) if not self.note else ()

    def stack(self) -> RankStack:
        """The main thread, innermost first, with each frame's source line (read here, on the rank's node)."""
        if self.note:
            return RankStack(self.rank, (), self.note)
        frames = main_thread(self.text, self.main_id)[:KEPT_FRAMES]
        if not frames:
            return RankStack(self.rank, (), "its dump had no Python frame")
        return RankStack(self.rank, tuple(Frame(f.file, f.line, f.function, _source(f.file, f.line)) for f in frames))


def stacks_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank_{rank}.stacks")


def rank_env(env: dict[str, str], directory: str, rank: int) -> dict[str, str]:
    """A rank's environment with the bootstrap first on PYTHONPATH and its dump file named."""
    path = os.pathsep.join(p for p in (SITE_DIR, env.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, STACKS_VARIABLE: stacks_path(directory, rank)}


def take_dumps(procs: list[RankProcess], directory: str, wait_s: float = DUMP_WAIT_SECONDS) -> dict[int, Dump]:
    """Ask every running rank of `procs` for its stacks at once; each rank's Dump within `wait_s`."""
    dumps: dict[int, Dump] = {}
    asked: dict[int, tuple[str, int, int]] = {}   # rank -> (file, size before, main thread id)
    for proc in procs:
        rank, path = proc.spec.rank, stacks_path(directory, proc.spec.rank)
        target = _armed_process(proc, _read(path, 0))
        if target is None:
            dumps[rank] = Dump(rank, note="no Python process of the rank armed the dump (not a Python rank, "
                                          "or python -I/-S, which skip PYTHONPATH or sitecustomize)")
            continue
        pid, main_id = target
        before = _size(path)
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            dumps[rank] = Dump(rank, note="it ended before its stack was taken")
            continue
        asked[rank] = (path, before, main_id)
    _wait_settled(asked, wait_s)
    for rank, (path, before, main_id) in asked.items():
        text = _read(path, before)
        dumps[rank] = Dump(rank, text, main_id) if text.strip() else Dump(
            rank, note=f"no dump within {wait_s:g} s (the script may have taken SIGUSR1 for itself)")
    return dumps


def sample_stacks(procs: list[RankProcess], directory: str, gap_s: float = SAMPLE_GAP_SECONDS,
                  samples: int = 3) -> list[RankStack]:
    """Every running rank's stack, taken `samples` times over `gap_s`: the last, marked `moved` where the
    main thread was elsewhere in an earlier one (a start-up importing, a slow step: busy, not hung)."""
    seen: dict[int, list[Dump]] = {}
    for sample in range(samples):
        if sample:
            time.sleep(gap_s / (samples - 1))
        for rank, dump in take_dumps(procs, directory).items():
            seen.setdefault(rank, []).append(dump)
    return [dataclasses.replace(dumps[-1].stack(), moved=any(_moved(earlier, dumps[-1]) for earlier in dumps[:-1]))
            for dumps in seen.values()]


def _moved(earlier: Dump, later: Dump) -> bool:
    """The main thread elsewhere: compared on every frame, not the kept innermost ones (a deep stack moves
    in its outer frames too)."""
    before, after = earlier.place(), later.place()
    return bool(before) and bool(after) and before != after


def _armed_process(proc: RankProcess, text: str) -> tuple[int, int] | None:
    """(pid, main thread id) of the oldest process in the rank's tree that armed the dump."""
    if proc.popen.poll() is not None:
        return None
    tree = {p.pid for p in process_tree(proc.popen.pid)}
    return next(((pid, main_id) for pid, main_id in armed(text) if pid in tree), None)


def _wait_settled(asked: dict[int, tuple[str, int, int]], wait_s: float) -> None:
    """Wait until every asked file grew and then stayed the same for SETTLED_SECONDS (or `wait_s` passed)."""
    deadline = time.monotonic() + wait_s
    last = {rank: (entry[1], time.monotonic()) for rank, entry in asked.items()}
    while time.monotonic() < deadline:
        now, waiting = time.monotonic(), False
        for rank, (path, before, _main) in asked.items():
            size = _size(path)
            if size != last[rank][0]:
                last[rank] = (size, now)
            if size <= before or now - last[rank][1] < SETTLED_SECONDS:
                waiting = True
        if not waiting:
            return
        time.sleep(0.05)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read(4 << 20).decode("utf-8", "replace")
    except OSError:
        return ""


def _source(file: str, line: int) -> str:
    if not line or file.startswith("<"):
        return ""
    linecache.checkcache(file)   # the agent lives on: a file edited since must not show its old line
    code = linecache.getline(file, line).strip()
    return code if len(code) <= CODE_CHARS else code[:CODE_CHARS - 3] + "..."

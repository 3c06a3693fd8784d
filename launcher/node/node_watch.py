"""``--stall_timeout`` on one node: its ranks' progress, their output, their stacks; what to stop.

A Supervisor with the stall watch on holds one NodeWatch. It gives every rank a progress file
(launcher/zero/stall_beat.py writes it) and a stack dump (stack_dump.py), counts the ranks' output
lines, and on each `tick` either reports (an agent: changed readings and the line count go to
dslaunch, which judges every rank of the job and asks back) or judges itself (the local runner:
these are all the job's ranks). It never kills: `tick` returns the ranks to stop and why, and the
Supervisor stops them, so every exit still goes through its one path.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable

from launcher.node.hang import diagnose
from launcher.node.process import RankOutput, RankProcess, RankSpec
from launcher.node.stack_dump import rank_env, sample_stacks, take_dumps
from launcher.node.stacks import HEADER, RankStack
from launcher.node.stall import (PROGRESS_VARIABLE, QuietWatch, StallWatch, describe_stall, make_progress_dir,
                                  progress_path, read_progress)

PROGRESS_POLL_SECONDS = 0.5    # how often the ranks' progress files are read (the local runner)
PROGRESS_REPORT_SECONDS = 1.0  # an agent sends its ranks' progress at most this often (1024 nodes: ~1000 msg/s)


@dataclass(frozen=True)
class Stop:
    """A rank to kill: stuck behind its peers (`stalled_s`), or chosen when the whole job hung (`hung_s`)."""

    rank: int
    stalled_s: float | None = None
    hung_s: float | None = None


@dataclass(frozen=True)
class WatchHooks:
    """Where a NodeWatch reports: the one message of a local judgement, raw stack lines (shown as the
    ranks' stderr), and for an agent its readings with the output count, and the stacks dslaunch asked for."""

    on_stall: Callable[[str], None]
    on_output: Callable[[RankOutput], None]
    on_progress: Callable[[list[tuple[int, int, int]], int], None] | None = None
    on_stacks: Callable[[list[RankStack], int], None] | None = None


class NodeWatch:
    def __init__(self, timeout_s: float, hooks: WatchHooks, host: str, progress_root: str):
        self.timeout_s = timeout_s
        self.hooks = hooks
        self.host = host
        self.progress_root = progress_root
        self.local = hooks.on_progress is None   # no agent: this node is the whole job, judged here
        self.watch = StallWatch(timeout_s) if self.local else None
        self.quiet = QuietWatch(timeout_s) if self.local else None
        self.directory: str | None = None
        self.output_lines = 0   # counted by every rank's output threads (a lost increment still moves it)
        self._lines_seen = 0
        self._reported: dict[int, tuple[int, int]] = {}   # rank -> (events, step) last sent to dslaunch
        self._next_read = 0.0
        self._done = False   # a stall or a hang was acted on: one report a try
        self._lock = threading.Lock()
        self._requests: list[tuple] = []   # from dslaunch (an agent's listening thread), done in tick

    def prepare(self, specs: list[RankSpec]) -> list[RankSpec]:
        """Make the progress folder; each rank's spec with its progress file and its stack dump armed."""
        self.directory = make_progress_dir(self.progress_root)
        return [dataclasses.replace(spec, env=rank_env({**spec.env, PROGRESS_VARIABLE: progress_path(
            self.directory, spec.rank)}, self.directory, spec.rank)) for spec in specs]

    def count_output(self, event: RankOutput) -> None:
        self.output_lines += 1
        self.hooks.on_output(event)

    def request(self, *what) -> None:
        """From dslaunch (thread-safe): ("stacks", rank, behind_s), ("dump", round), or ("stop_hung", ranks, quiet_s)."""
        with self._lock:
            self._requests.append(what)

    def tick(self, procs: list[RankProcess], ended: set[int]) -> list[Stop]:
        """One turn of the run loop while no rank ended: requests first, then the progress files."""
        with self._lock:
            requests, self._requests = self._requests, []
        running = [p for p in procs if p.spec.rank not in ended and p.popen.poll() is None]
        stops: list[Stop] = []
        for what in requests:
            stops += self._answer(what, running)
        now = time.monotonic()
        if stops or self._done or now < self._next_read:
            return stops
        self._next_read = now + (PROGRESS_POLL_SECONDS if self.local else PROGRESS_REPORT_SECONDS)
        readings = [(p.spec.rank, *reading) for p in running
                    if (reading := read_progress(progress_path(self.directory, p.spec.rank))) is not None]
        if not self.local:
            self._report(readings)
            return []
        return self._judge(readings, running, now)

    def _answer(self, what: tuple, running: list[RankProcess]) -> list[Stop]:
        if what[0] == "stacks" and not self._done:   # dslaunch found a straggler here
            self._done = True
            self._show_stacks(running)
            return [Stop(int(what[1]), stalled_s=float(what[2]))]
        if what[0] == "dump":   # the whole job went quiet: dslaunch judges every rank's stack
            self.hooks.on_stacks(sample_stacks(running, self.directory), what[1])
        elif what[0] == "stop_hung" and not self._done:
            self._done = True
            return [Stop(int(rank), hung_s=float(what[2])) for rank in what[1]]
        return []

    def _report(self, readings: list[tuple[int, int, int]]) -> None:
        """An agent: the readings that changed, and the output count when it moved, to dslaunch."""
        changed = [r for r in readings if self._reported.get(r[0]) != r[1:]]
        self._reported.update({r[0]: r[1:] for r in changed})
        lines = self.output_lines
        if changed or lines != self._lines_seen:
            self._lines_seen = lines
            self.hooks.on_progress(changed, lines)

    def _judge(self, readings, running: list[RankProcess], now: float) -> list[Stop]:
        """The local runner: a straggler first (as before), else a job in which nothing moved."""
        moved = [self.watch.observe(rank, events, step, now) for rank, events, step in readings]
        lines = self.output_lines
        if any(moved) or lines != self._lines_seen:
            self._lines_seen = lines
            self.quiet.saw(now)
        stall = self.watch.stuck(now)
        if stall is not None:
            self._done = True
            self.hooks.on_stall(describe_stall(stall, self.host, self.timeout_s))
            self._show_stacks(running)
            return [Stop(stall.rank, stalled_s=stall.behind_s)]
        if not self.quiet.quiet(now) or not running:
            return []
        quiet_s = self.quiet.quiet_for(now)
        stacks = {stack.rank: stack for stack in sample_stacks(running, self.directory)}
        if any(stack.moved for stack in stacks.values()):   # busy, not hung: a start-up, a long silent step
            self.quiet.saw(time.monotonic())
            return []
        self._done = True
        diagnosis = diagnose(stacks, {rank: self.host for rank in stacks}, quiet_s, self.timeout_s)
        self.hooks.on_stall(diagnosis.message)
        return [Stop(rank, hung_s=quiet_s) for rank in diagnosis.stop]

    def _show_stacks(self, running: list[RankProcess]) -> None:
        """A straggler: every rank's whole dump, shown as its stderr lines (as the ranks printed it before)."""
        for rank, dump in sorted(take_dumps(running, self.directory).items()):
            for line in dump.text.splitlines():
                if not line.startswith(HEADER):
                    self.hooks.on_output(RankOutput(rank, "stderr", line))

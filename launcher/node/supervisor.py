"""Supervise one node's ranks: the first failure stops the rest, signals reach all.

Used in-process by the local runner and by the per-node agent. It reports through
callbacks and never prints, so the two can route output their own way.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from launcher.node.node_watch import NodeWatch, Stop, WatchHooks
from launcher.node.process import RankExit, RankOutput, RankProcess, RankSpec, spawn, stop_processes
from launcher.node.stacks import RankStack

POLL_SECONDS = 0.02
DRAIN_SECONDS = 1.0        # a failed or finished rank's output threads get this long to reach EOF
STOPPED_DRAIN_SECONDS = 0.5  # one wait for every stopped rank's output (a pipe an escaped grandchild holds)
KILL_WAIT_SECONDS = 5.0    # a rank that outlives SIGKILL this long is stuck in the kernel: reported, left


@dataclass(frozen=True)
class NodeResult:
    """How a node ended: every rank's exit, the first failure, or why it was stopped."""

    exits: tuple[RankExit, ...]
    first_failure: RankExit | None = None
    stopped_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.first_failure is None and self.stopped_by is None


def _ignore(_event) -> None:
    return None


@dataclass(frozen=True)
class NodeHooks:
    """Where a Supervisor reports (it never prints): every rank's lines, exits, the first failure as
    soon as it is seen, a stuck rank or a hung job (local runner), and for an agent (dslaunch judges):
    changed progress readings with the count of output lines, and the stacks dslaunch asked for."""

    on_output: Callable[[RankOutput], None]
    on_exit: Callable[[RankExit], None] = _ignore
    on_failure: Callable[[RankExit], None] = _ignore
    on_stall: Callable[[str], None] = _ignore
    on_progress: Callable[[list[tuple[int, int, int]], int], None] | None = None
    on_stacks: Callable[[list[RankStack], int], None] = lambda _stacks, _round: None


@dataclass(frozen=True)
class NodeSettings:
    """Where rank logs go, the stop's grace, this node's host name, --stall_timeout, and where the
    ranks' progress folders are made (default: the temp dir)."""

    log_dir: str | None = None
    grace: float = 3.0
    host: str = ""
    stall_timeout: float | None = None
    progress_root: str | None = None


class Supervisor:
    """Starts `specs`, watches them, and tears all of them down on the first failure.

    `on_failure` hears of the first failure the moment it is seen, before the other ranks are
    stopped and before the failed rank's output is drained (its `on_exit`, with its last lines,
    comes after both): the agent tells dslaunch at once, so the other nodes stop at once too.
    `spawner` starts one rank (process.spawn; a test passes its own). With `stall_timeout` (the
    local runner: these are all the job's ranks), a rank that makes no progress while the others
    go on is named through `on_stall`, every rank here is asked for its Python stack (SIGUSR1,
    faulthandler), and the stuck rank is killed: its exit is then the job's failure, as any other
    (restarted under --max_restarts); a job in which no rank moves at all is diagnosed from every
    rank's stack and its likely cause killed the same way (node_watch.py). With `on_progress`
    instead (an agent: dslaunch judges every rank of the job), changed readings go out through it
    and `request_stacks`, `request_dump` and `request_hung_stop` do the rest.
    """

    def __init__(self, specs: list[RankSpec], hooks: NodeHooks, settings: NodeSettings = NodeSettings(),
                 spawner: Callable[..., RankProcess] = spawn):
        on_output, on_exit, on_failure = hooks.on_output, hooks.on_exit, hooks.on_failure
        log_dir, grace, host = settings.log_dir, settings.grace, settings.host
        self.specs = specs
        self.on_output = on_output
        self.on_exit = on_exit
        self.on_failure = on_failure
        self.log_dir = log_dir
        self.grace = grace
        self.host = host
        self.spawner = spawner
        self.procs: list[RankProcess] = []
        self._logs = []
        self._stop_request: tuple[str, int] | None = None
        self._watch = NodeWatch(settings.stall_timeout, WatchHooks(hooks.on_stall, on_output, hooks.on_progress,
                                                                   hooks.on_stacks),
                                host, settings.progress_root or tempfile.gettempdir()) \
            if settings.stall_timeout or hooks.on_progress is not None else None
        self._stopped_as: dict[int, Stop] = {}   # rank -> why the stall watch stopped it
        self._unkillable: dict[int, int] = {}  # stuck rank -> its pid, when even SIGKILL did not end it

    def request_stop(self, reason: str, signum: int = signal.SIGTERM) -> None:
        """Ask the run loop to stop every rank (safe from a signal handler or thread)."""
        if self._stop_request is None:
            self._stop_request = (reason, signum)

    def request_stacks(self, rank: int, behind_s: float) -> None:
        """dslaunch found `rank` stuck: every rank here prints its stack, then `rank` is killed (thread-safe)."""
        if self._watch is not None:
            self._watch.request("stacks", rank, behind_s)

    def request_dump(self, round_number: int) -> None:
        """dslaunch found the whole job quiet: every rank's stack goes back through `on_stacks` (thread-safe)."""
        if self._watch is not None:
            self._watch.request("dump", round_number)

    def request_hung_stop(self, ranks: list[int], quiet_s: float) -> None:
        """dslaunch judged the hung job's stacks: kill `ranks` (those of this node), marked as hung (thread-safe)."""
        if self._watch is not None:
            self._watch.request("stop_hung", [r for r in ranks if r in {s.rank for s in self.specs}], quiet_s)

    def start(self) -> None:
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
        on_output = self.on_output
        if self._watch is not None:
            self.specs = self._watch.prepare(self.specs)
            on_output = self._watch.count_output
        for spec in self.specs:
            log = open(os.path.join(self.log_dir, f"rank_{spec.rank}.log"), "a", encoding="utf-8") \
                if self.log_dir else None
            self._logs.append(log)
            self.procs.append(self.spawner(spec, on_output, log))

    def run(self) -> NodeResult:
        """Block until every rank ended, a rank failed, or a stop was requested.

        On a failure the other ranks are stopped first and the failed rank's output drained
        after: a peer must not live on (the drain can take a second) to fail on the rendezvous
        store the failed rank took with it and print an error of its own."""
        exits: dict[int, RankExit] = {}
        first_failure = None
        while len(exits) < len(self.procs):
            ended = [(proc, code) for proc in self.procs
                     if proc.spec.rank not in exits and (code := self._poll(proc)) is not None]
            failed = next(((proc, code) for proc, code in ended if code != 0), None)
            if failed is not None:
                self.on_failure(RankExit(failed[0].spec.rank, failed[0].spec.local_rank, failed[1], (), self.host))
            request = self._stop_request   # read once: a signal handler may set it meanwhile
            stop = signal.SIGTERM if failed is not None else request[1] if request is not None else None
            stopped = [] if stop is None else self._stop_running(stop, exits.keys() | {p.spec.rank for p, _ in ended})
            _join_readers([proc for proc, _ in ended], timeout=DRAIN_SECONDS)
            for proc, code in ended:
                why = self._stopped_as.get(proc.spec.rank, Stop(proc.spec.rank))
                done = RankExit(proc.spec.rank, proc.spec.local_rank, code, tuple(proc.tail), self.host,
                                stalled_s=why.stalled_s, hung_s=why.hung_s,
                                stuck_pid=self._unkillable.get(proc.spec.rank))
                exits[done.rank] = done
                self.on_exit(done)
                if not done.ok and first_failure is None:
                    first_failure = done
            if stop is not None:
                self._report_stopped(stopped, exits)
                break
            if self._watch is not None and not ended:
                for stop in self._watch.tick(self.procs, set(exits)):
                    self._stop_as(stop)
            time.sleep(POLL_SECONDS)
        self._close_logs()
        stopped_by = self._stop_request[0] if self._stop_request and first_failure is None else None
        ordered = tuple(exits[p.spec.rank] for p in self.procs if p.spec.rank in exits)
        return NodeResult(exits=ordered, first_failure=first_failure, stopped_by=stopped_by)

    def _poll(self, proc: RankProcess) -> int | None:
        """Its return code once ended; a stuck rank that outlived SIGKILL counts as ended (-SIGKILL)."""
        return -signal.SIGKILL if proc.spec.rank in self._unkillable else proc.popen.poll()

    def _stop_running(self, signum: int, ended: set[int]) -> list[tuple[RankProcess, int, int | None]]:
        """Stop every rank not in `ended`: (process, return code, pid if it outlived SIGKILL)."""
        running = [p for p in self.procs if p.spec.rank not in ended]
        stop_processes([p.popen for p in running], first_signal=signum, grace=self.grace)
        stopped = []
        for proc in running:
            code, stuck = proc.popen.poll(), None
            if code is None:
                code, stuck = _kill(proc.popen)
            stopped.append((proc, code, stuck))
        return stopped

    def _report_stopped(self, stopped, exits: dict[int, RankExit]) -> None:
        """The stopped ranks' exits (dslaunch tells a stopped rank from a failed one by whether it
        had asked for the stop before), once their output is drained."""
        # one deadline for all: a pipe kept open by an escaped grandchild costs 0.5 s, not 0.5 s a rank
        _join_readers([proc for proc, _, _ in stopped], timeout=STOPPED_DRAIN_SECONDS)
        for proc, code, stuck in stopped:
            exits[proc.spec.rank] = RankExit(proc.spec.rank, proc.spec.local_rank, code, tuple(proc.tail),
                                             self.host, stuck_pid=stuck)
            self.on_exit(exits[proc.spec.rank])

    def _close_logs(self) -> None:
        for log in self._logs:
            if log is not None:
                log.close()
        if self._watch is not None and self._watch.directory is not None:
            shutil.rmtree(self._watch.directory, ignore_errors=True)

    def _stop_as(self, stop: Stop) -> None:
        """Kill a rank the stall watch chose (its stacks were taken): its exit ends or restarts the job."""
        self._stopped_as[stop.rank] = stop
        proc = next((p for p in self.procs if p.spec.rank == stop.rank), None)
        if proc is not None and proc.popen.poll() is None:
            _code, pid = _kill(proc.popen)
            if pid is not None:   # in the kernel (a hung file system): the job ends without it
                self._unkillable[stop.rank] = pid


def _kill(popen) -> tuple[int, int | None]:
    """SIGKILL a rank that is still there after the stop; (its return code, None), or
    (-SIGKILL, its pid) when even SIGKILL does not end it within KILL_WAIT_SECONDS (a process in
    uninterruptible sleep, e.g. on a hung file system): waiting longer would hang the whole job."""
    popen.kill()
    try:
        return popen.wait(timeout=KILL_WAIT_SECONDS), None
    except subprocess.TimeoutExpired:
        return -signal.SIGKILL, popen.pid


def _join_readers(procs: list[RankProcess], timeout: float) -> None:
    """Wait for the output threads of `procs` to reach EOF, `timeout` seconds at most in all."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        for reader in proc.readers:
            reader.join(timeout=max(0.0, deadline - time.monotonic()))

"""The process layer: spawn ranks, stream their output, tear down their trees.

Processes are found by the pids we started and their descendants (read from
/proc/PID/task/*/children), never by a name pattern, so other jobs on the same host are never touched.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import psutil

TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankSpec:
    """One rank to start: what a node's supervisor needs from the plan."""

    rank: int
    local_rank: int
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    cores: tuple[int, ...] = ()   # CPU cores the rank is bound to (--bind_cores_to_rank); () = all


@dataclass(frozen=True)
class RankOutput:
    rank: int
    stream: str  # "stdout" or "stderr"
    line: str


@dataclass(frozen=True)
class RankExit:
    rank: int
    local_rank: int
    returncode: int
    tail: tuple[str, ...] = ()
    host: str = ""
    stuck_pid: int | None = None   # it outlived SIGKILL (stuck in the kernel): left running as this pid
    stalled_s: float | None = None  # stopped by --stall_timeout: no progress this long while its peers went on
    hung_s: float | None = None     # stopped by --stall_timeout: no rank of the job made progress this long

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def exit_code(self) -> int:
        """The shell convention: 128+N for a rank killed by signal N."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def describe(self) -> str:
        where = f"rank {self.rank}" + (f" on {self.host}" if self.host else "")
        if self.stuck_pid is not None:
            return (f"{where} did not end after SIGKILL and was left running as pid {self.stuck_pid}: a process "
                    f"that ignores SIGKILL is stuck in the kernel (often a hung file system or device)")
        if self.stalled_s is not None:
            return (f"{where} was stopped as stuck: no progress for {self.stalled_s:.0f} s while the other ranks "
                    f"went on (--stall_timeout; its stack is above)")
        if self.hung_s is not None:
            return (f"{where} was stopped as hung: no rank made progress for {self.hung_s:.0f} s "
                    f"(--stall_timeout; what each rank was doing is said above)")
        if self.returncode < 0:
            number = -self.returncode
            try:
                name = signal.Signals(number).name
            except ValueError:
                name = f"signal {number}"
            what = f"killed ({name})"
            if number == signal.SIGKILL:
                what += ": often the host ran out of memory"
            return f"{where} was {what}"
        return f"{where} exited with code {self.returncode}"


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec hook so a rank gets SIGKILL if its supervisor dies (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return hook


def _child_setup(cores: tuple[int, ...]) -> Callable[[], None] | None:
    """The preexec hook: the parent-death signal, and the rank's cores when it is bound."""
    death = _parent_death_signal()
    if not cores:
        return death

    def hook() -> None:
        if death is not None:
            death()
        os.sched_setaffinity(0, cores)
    return hook


@dataclass
class RankProcess:
    spec: RankSpec
    popen: subprocess.Popen
    tail: deque = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    readers: list = field(default_factory=list)


def spawn(spec: RankSpec, on_output: Callable[[RankOutput], None], log_file=None) -> RankProcess:
    """Start one rank in its own session; two threads stream its stdout and stderr."""
    popen = subprocess.Popen(list(spec.argv), env=spec.env, cwd=spec.cwd, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=_child_setup(spec.cores))
    proc = RankProcess(spec=spec, popen=popen)
    lock = threading.Lock()
    for stream_name, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
        thread = threading.Thread(target=_pump, args=(proc, stream_name, pipe, on_output, log_file, lock),
                                  daemon=True)
        thread.start()
        proc.readers.append(thread)
    return proc


def _pump(proc: RankProcess, stream: str, pipe, on_output, log_file, lock) -> None:
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        proc.tail.append(line)
        if log_file is not None:
            with lock:
                log_file.write(line + "\n")
                log_file.flush()
        on_output(RankOutput(proc.spec.rank, stream, line))
    pipe.close()


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid`, from /proc/PID/task/*/children (one small read per thread).

    psutil's children() reads every process's stat file on the machine to build a parent map;
    with 128 nodes' agents tearing down on one host at once that scan was most of the stop time.
    """
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                found += [int(word) for word in handle.read().split()]
        except OSError:
            continue   # the thread ended meanwhile
    return found


def _has_children_files() -> bool:
    """Linux built with CONFIG_PROC_CHILDREN (every mainstream kernel); else psutil's scan is used."""
    return os.path.exists(f"/proc/self/task/{os.getpid()}/children")


HAS_CHILDREN_FILES = _has_children_files()


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants that are still alive (parents before children)."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return []
    if not HAS_CHILDREN_FILES:
        try:
            return [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
    tree, seen, queue = [root], {pid}, [pid]
    while queue:
        for child in child_pids(queue.pop()):
            if child in seen:
                continue
            seen.add(child)
            try:
                tree.append(psutil.Process(child))   # records its start time: a reused pid is never signalled
            except psutil.NoSuchProcess:
                continue
            queue.append(child)
    return tree


def signal_tree(pid: int, signum: int) -> list[psutil.Process]:
    tree = process_tree(pid)
    for proc in tree:
        try:
            proc.send_signal(signum)
        except psutil.NoSuchProcess:
            pass
    return tree


def stop_processes(popens: list[subprocess.Popen], first_signal: int = signal.SIGTERM,
                   grace: float = 3.0) -> None:
    """Signal every process tree we started; SIGKILL whatever is left after `grace` s.

    Every process is watched in one loop, so the stop takes as long as the slowest process,
    not the sum of them. Our direct children are reaped through their Popen so their exit
    codes stay right.
    """
    descendants: list[psutil.Process] = []
    for popen in popens:
        if popen.poll() is None:
            descendants += [p for p in signal_tree(popen.pid, first_signal) if p.pid != popen.pid]
    descendants = _wait_all(popens, descendants, grace)
    if not descendants and all(p.poll() is not None for p in popens):
        return
    for popen in popens:
        if popen.poll() is None:
            descendants += [p for p in signal_tree(popen.pid, signal.SIGKILL) if p.pid != popen.pid]
    for proc in _alive(descendants):
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    _wait_all(popens, descendants, 2.0)


def _wait_all(popens: list[subprocess.Popen], descendants: list[psutil.Process],
              timeout: float) -> list[psutil.Process]:
    """Poll every process together until all have ended or `timeout` s passed.

    Returns the descendants still alive; `popens` that ended are reaped by poll()."""
    deadline = time.monotonic() + timeout
    while True:
        running = [p for p in popens if p.poll() is None]
        descendants = _alive(descendants)
        if (not running and not descendants) or time.monotonic() >= deadline:
            return descendants
        time.sleep(0.02)


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            pass
    return alive

"""The offloaded optimizer step in a background thread (``offload_optimizer.overlap_step``).

With optimizer offload the GPU sits idle while the host runs Adam. Here ``engine.step()``
returns as soon as the step's inputs are fixed (gradients on the host, norm and clip factor
known, hyper-parameters read); one worker thread runs the CPU Adam chunk by chunk, first
chunk first, and uploads each finished chunk to the device. The next forward waits per
module, only for the chunks that hold that module's parameters, so the first layers compute
while the host still updates the last ones.

Glossary: a *position* is the index of one flat master tensor (one per optimizer group); its
*mark* is how many of its leading elements are final on the device (uploaded, or written in
place). ``publish`` raises a mark from the worker thread; ``wait_for`` blocks until a mark
reaches what a module needs, and makes the caller's CUDA stream wait for the copy's event.

Anything that reads parameters or optimizer state outside the forward (checkpoints,
state_dict, backward's next step, destroy) calls ``wait`` first, which also re-raises an
exception the worker thread hit. A script that ends right after ``step()`` makes no such call:
an exit hook then raises the step's exception as an uncaught one (the rank's failure hook
says it) and ends the rank with a non-zero code, instead of losing it with exit code 0.
"""
from __future__ import annotations

import atexit
import bisect
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from launcher.zero.optim.cpu_adam import default_num_threads


def step_threads() -> int:
    """Threads for the background step's CPU Adam: one core fewer than this process may use,
    so the training thread, which launches the forward's kernels meanwhile, keeps a core of its
    own (a busy core delays the kernel launches, and one straggler delays each chunk's update).
    ``DSLAUNCH_CPU_ADAM_THREADS`` sets the number."""
    configured = os.environ.get("DSLAUNCH_CPU_ADAM_THREADS", "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(1, default_num_threads() - 1)


class StepOverlap:
    """One background optimizer step at a time, with per-position upload marks."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="zero-overlap-step")
        self._cond = threading.Condition()
        self._future: Future | None = None
        self._finished = True
        self._marks: list[int] = []
        self._events: list[list[tuple[int, object]]] = []
        self._streams: list = []
        self._done: list = []          # an event per stream, recorded when the step's work ended
        self._worker: int | None = None
        #: a side stream for uploads a strategy issues itself (stage 3); None on the CPU
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        #: for what watches the step (the offload advice): the last finished step's seconds in the
        #: worker, and the seconds the training thread has spent blocked on steps in all
        self.work_seconds: float | None = None
        self.waited_seconds = 0.0
        atexit.register(self._check_at_exit)

    @property
    def busy(self) -> bool:
        """Whether a step was started and not yet waited for."""
        return self._future is not None

    @property
    def in_worker(self) -> bool:
        """Whether the caller is the worker thread of a running step."""
        return not self._finished and threading.get_ident() == self._worker

    def start(self, positions: int, work: Callable[[], None]) -> None:
        """Run ``work`` (the step, its uploads, its ``publish`` calls) in the worker thread."""
        self.wait()
        with self._cond:
            self._marks = [0] * positions
            self._events = [[] for _ in range(positions)]
            self._streams = []
            self._done = []
            self._finished = False
        self._future = self._pool.submit(self._run, work)

    def _run(self, work: Callable[[], None]) -> None:
        self._worker = threading.get_ident()
        started = time.perf_counter()
        try:
            if self.cuda:
                torch.cuda.set_device(self.device)   # the current device is per thread
                torch.set_num_threads(step_threads())   # per thread: the training thread keeps its own
            with torch.no_grad():                    # and so is grad mode
                work()
            if self.cuda:   # the step's own copies end here; a stream shared with later work runs on
                self._done = [torch.cuda.Event() for _ in self._streams]
                for event, stream in zip(self._done, self._streams):
                    event.record(stream)
            self.work_seconds = time.perf_counter() - started
        finally:
            with self._cond:
                self._finished = True
                self._cond.notify_all()

    def publish(self, position: int, end: int, stream=None) -> None:
        """Worker thread: elements [0, end) of ``position`` are final once ``stream``'s queued work is.
        A no-op outside a running step (a synchronous write-back after a checkpoint load)."""
        if self._finished:
            return
        event = None
        if self.cuda and stream is not None:
            event = torch.cuda.Event()
            event.record(stream)
        with self._cond:
            if stream is not None and all(s is not stream for s in self._streams):
                self._streams.append(stream)
            if end > self._marks[position]:
                self._marks[position] = end
                self._events[position].append((end, event))
            self._cond.notify_all()

    def is_final(self, position: int, end: int) -> bool:
        """Whether ``wait_for(position, end)`` would return without blocking the thread."""
        return self._future is None or self._finished or self._marks[position] >= end

    def wait_for(self, position: int, end: int) -> None:
        """Block until elements [0, end) of ``position`` are final; the current stream waits for their copy."""
        if self._future is None:
            return
        started = time.perf_counter()
        with self._cond:
            while self._marks[position] < end and not self._finished:
                self._cond.wait()
            self.waited_seconds += time.perf_counter() - started
            reached = self._marks[position] >= end
            event = next((e for mark, e in self._events[position] if mark >= end), None) if reached else None
        if not reached:          # the step ended short of it: failed, or the mark was never published
            self.wait()
            return
        if event is not None:
            torch.cuda.current_stream().wait_event(event)

    def wait(self) -> None:
        """Block until the step is done; re-raise what it raised; the current stream waits for its copies."""
        future, self._future = self._future, None
        if future is None:
            return
        started = time.perf_counter()
        try:
            future.result()   # re-raises the worker's exception here, once
        finally:
            self.waited_seconds += time.perf_counter() - started
        if self.cuda:
            # the step's copies, not the whole stream: stage 1-2 offload also copies the next
            # backward's gradients to the host on it, which the step's norm need not wait for
            current = torch.cuda.current_stream()
            for event in self._done:
                current.wait_event(event)

    def close(self) -> None:
        """Wait for the step (errors included) and stop the worker thread."""
        atexit.unregister(self._check_at_exit)
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

    def _check_at_exit(self) -> None:
        """At interpreter exit (the pool's thread has ended by then): a step's error fails the rank."""
        try:
            self.wait()
        except BaseException as error:   # noqa: BLE001 -- any exception of the step is the rank's failure
            sys.excepthook(type(error), error, error.__traceback__)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)   # an exception in an atexit hook would leave the exit code at 0


class FirstUseOrder:
    """``chunk_priority`` for our CPU Adam: a chunk of a flat master ranks by the earliest
    parameter it holds (in ``module.named_parameters()`` order, the order a forward usually
    reads them), so the first layers of every optimizer group are updated first."""

    def __init__(self, masters, starts: list[list[int]], ranks: list[list[int]]):
        self.position_of = {id(master): position for position, master in enumerate(masters)}
        self.starts, self.ranks = starts, ranks

    def __call__(self, master, start: int, end: int) -> int:
        position = self.position_of.get(id(master))
        if position is None or not self.starts[position]:
            return 0
        starts, ranks = self.starts[position], self.ranks[position]
        first = max(0, bisect.bisect_right(starts, start) - 1)
        last = max(first + 1, bisect.bisect_left(starts, end))
        return min(ranks[first:last])

"""Optimizer offload's advice (issue 43): the host-side bound at start, and after the first timed
steps what offload costs and which ``offload_optimizer.ratio`` would hide the host step.

A watcher of the step (step_observer.py calls it): rank 0 only, and only with the optimizer
offloaded to the CPU; it never fails a step: its first error is a warning and it stops. The
arithmetic is offload_advice.py's; here are the clock, the one bandwidth measurement (a copy of
a 256 MiB host buffer, the best of three, once a process) and the engine facts it reads.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from launcher.zero.engine import offload_advice as advice
from launcher.zero.optim.cpu_adam import CPUAdam

COPY_BYTES = 256 << 20
_measured: dict[int, float] = {}   # bytes copied -> bytes/s: measured once a process


def host_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 3, clock: Callable[[], float] = time.perf_counter) -> float:
    """Host memory bandwidth in bytes/s: the best of ``repeats`` copies of an ``nbytes`` buffer (a
    copy reads and writes each byte); pages touched first, so the first copy faults nothing in."""
    if nbytes not in _measured:
        source = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        target = torch.zeros_like(source)
        best = float("inf")
        for _ in range(repeats):
            started = clock()
            target.copy_(source)
            best = min(best, clock() - started)
        _measured[nbytes] = 2 * source.numel() * 4 / max(best, 1e-9)
    return _measured[nbytes]


@dataclass(frozen=True)
class OffloadFacts:
    """What the advice needs of one engine (``offload_facts``)."""

    offloaded: int        # elements this rank's CPU Adam steps
    total: int            # elements of this rank's masters
    per_parameter: int    # host bytes an offloaded parameter's update moves
    overlap: bool         # offload_optimizer.overlap_step
    ratio: float          # offload_optimizer.ratio


def offload_facts(engine) -> OffloadFacts | None:
    """The engine's offload facts; None where no optimizer step runs on the host's CPU Adam."""
    strategy, zero = engine.strategy, engine.zero_config.zero_optimization
    offloaded = strategy.offloaded_numel() if zero.offload_optimizer_active else 0
    if offloaded <= 0:
        return None
    masters = strategy.master_tensors()
    master = masters[0]
    optimizer = engine.basic_optimizer   # our CPU Adam may keep bf16 moments (bf16_optimizer_states)
    moment_dtype = optimizer.moment_dtype(master) if isinstance(optimizer, CPUAdam) else master.dtype
    size = master.element_size()
    per_parameter = advice.bytes_per_parameter(size, size, torch.empty((), dtype=moment_dtype).element_size())
    return OffloadFacts(offloaded, sum(m.numel() for m in masters), per_parameter,
                        bool(zero.offload_optimizer.overlap_step), float(zero.offload_optimizer.ratio))


class OffloadAdvisor:
    """Says the bound at start (``start``), times the first steps and says the advice once."""

    def __init__(self, facts: OffloadFacts, monitor, overlap=None, cuda: bool = False,
                 clock: Callable[[], float] = time.perf_counter, samples: advice.StepSamples | None = None):
        self.facts, self.monitor, self.overlap, self.cuda, self.clock = facts, monitor, overlap, cuda, clock
        self.samples = samples or advice.StepSamples()
        self.least = 0.0
        self.active = True
        self._fb_started: float | None = None
        self._backward_started: float | None = None
        self._backward = 0.0
        self._waited = 0.0
        self._fb = 0.0
        self._step_started = 0.0
        self._skipped: int | None = None

    def _guarded(self, work, *args) -> None:
        if not self.active:
            return
        try:
            work(*args)
        except Exception as error:   # noqa: BLE001 -- a watcher's failure is a warning, never the step's
            self.active = False
            self.monitor.warn(f"offload advice: {type(error).__name__}: {error}; training goes on without it")

    def start(self, bandwidth: Callable[[], float] = host_bandwidth) -> None:
        self._guarded(self._start, bandwidth)

    def _start(self, bandwidth) -> None:
        measured = bandwidth()
        facts = self.facts
        self.least = advice.least_host_seconds(facts.offloaded, facts.per_parameter, measured)
        self.monitor.log(advice.start_line(measured, COPY_BYTES, facts.per_parameter, facts.offloaded, self.least))

    # ---- the step's boundaries (StepObserver) ----------------------------------------------------
    def forward_begins(self) -> None:
        self._guarded(self._forward_begins)

    def _forward_begins(self) -> None:
        if self._fb_started is None:   # the first micro-step of this accumulation
            self._fb_started, self._waited, self._backward = self.clock(), self._waited_now(), 0.0
        else:                          # a later one: the last micro-step's backward ends here
            self._backward_ends()

    def backward_begins(self) -> None:
        self._guarded(self._backward_begins)

    def _backward_begins(self) -> None:
        if self._fb_started is None:
            return
        if self.cuda:   # the forward's kernels end before the backward's are timed (sampled steps only)
            torch.cuda.synchronize()
        self._backward_started = self.clock()

    def _backward_ends(self) -> None:
        if self._backward_started is not None:
            if self.cuda:
                torch.cuda.synchronize()
            self._backward += self.clock() - self._backward_started
            self._backward_started = None

    def step_begins(self) -> None:
        self._guarded(self._step_begins)

    def _step_begins(self) -> None:
        if self._fb_started is None:
            return
        self._backward_ends()
        if self.cuda:   # the backward's kernels, not their launch (offload's step syncs here anyway)
            torch.cuda.synchronize()
        now = self.clock()
        self._fb = now - self._fb_started - (self._waited_now() - self._waited)
        self._step_started, self._fb_started = now, None

    def step_done(self, skipped: int) -> None:
        self._guarded(self._step_done, skipped)

    def _step_done(self, skipped: int) -> None:
        before, self._skipped = self._skipped, skipped
        if self._fb <= 0 or (before is not None and skipped != before):   # a skipped step runs no Adam
            return
        host = self.clock() - self._step_started if self.overlap is None else self.overlap.work_seconds
        if host is None:
            return
        if self.samples.add(self._fb, host, self._backward):
            fb, host, backward = self.samples.medians()
            facts = self.facts
            forward = advice.forward_seconds(fb, backward, facts.overlap)
            hiding = advice.hiding_ratio(forward, host, facts.offloaded / max(1, facts.total))
            self.monitor.log(advice.measured_line(self.samples.count, fb, backward, host, self.least, facts.overlap,
                                                  facts.ratio, hiding))
            self.active = False   # said once

    def _waited_now(self) -> float:
        return self.overlap.waited_seconds if self.overlap is not None else 0.0


def start_advisor(engine, monitor) -> OffloadAdvisor | None:
    """Rank 0 with the optimizer offloaded to the CPU: the start line, and the advisor that times the
    first steps; None elsewhere (quiet)."""
    if engine.global_rank != 0:
        return None
    try:
        facts = offload_facts(engine)
    except Exception as error:   # noqa: BLE001 -- as the advisor's own errors: a warning
        monitor.warn(f"offload advice: {type(error).__name__}: {error}; training goes on without it")
        return None
    if facts is None:
        return None
    advisor = OffloadAdvisor(facts, monitor, engine.strategy.overlap, engine.dist_context.device.type == "cuda")
    advisor.start()
    return advisor

"""What watches both engines' steps, called at their boundaries, so each step shows only its math.

``ZeroEngine`` calls, in this order::

    forward_begins()              before the fp16 cast and the strategy's pre_forward
    with forward(args, kwargs):   around the module's forward
    forward_done(output)          after the strategy's post_forward
    backward_begins(loss)         before the loss is divided and scaled
    with backward():              around autograd
    backward_done()               after the strategy's post_backward
    step_reached()                every engine.step()
    with step():                  around the optimizer step of an accumulation boundary
    step_done(facts)              after it, with the step's numbers

``PipelineEngine`` (pipeline/engine.py) runs a batch's forwards and backwards as one schedule, so it
calls, per ``train_batch`` (``eval_batch``: the first two)::

    batch_begins()                before the batch's schedule
    with schedule(link):          around this stage's schedule of forwards and backwards
    step_reached()                before the optimizer step

Behind it: the stall beat (launcher.zero.stall_beat, ``--stall_timeout``), the phase timers and the
progress line (reporting.Progress), the FLOPs count, the profile and the inf/NaN diagnosis
(instruments.StepInstruments), the marks that route a plain ``loss.backward()`` through the engine
(plain_backward.BackwardHooks), and optimizer offload's advice (offload_advisor.OffloadAdvisor, set by
initialize on rank 0 with the optimizer offloaded); for the pipeline, the schedule's wall time and receive waits
(``schedule_timing``). None of it changes what the step computes; what watches never
fails the step (instruments.py says how).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable

import torch

import launcher.zero.stall_beat as stall_beat   # --stall_timeout
from launcher.zero.engine.instruments import InstrumentedRun, StepInstruments
from launcher.zero.engine.optimizer_step import StepCounters
from launcher.zero.engine.plain_backward import BackwardHooks
from launcher.zero.engine.reporting import Progress, StepFacts


class StepObserver:
    """One per engine: the one interface between the engine's step and what watches it.

    The pipeline engine builds it from its ``counters`` alone: it calls the batch hooks and
    ``step_reached`` (the stall beat and the schedule's timing; no progress line, FLOPs count or
    inf/NaN trace there), and the micro-step hooks, which read the rest, are ZeroEngine's."""

    def __init__(self, counters: StepCounters, run: InstrumentedRun | None = None,
                 instruments: StepInstruments | None = None, hooks: BackwardHooks | None = None,
                 compiled: Callable[[], bool] = lambda: False, memory: Callable[[], dict[str, int]] = dict):
        self.counters = counters        # the engine's step counters, read (never written) here
        self.run = run                  # module, loss scaler, stage, micro-batch, progress
        self.progress: Progress | None = run.progress if run is not None else None
        self.instruments = instruments
        self.hooks = hooks
        self.compiled = compiled        # whether engine.compile() ran (no hooks then, no eager count on old torch)
        self.memory = memory            # the memory breakdown, for the progress line
        #: the last pipeline schedule's wall time and the time it waited in receives (``schedule``)
        self.schedule_timing: dict[str, float] = {}
        #: optimizer offload's advice (offload_advisor.py); None: no offload, or not rank 0
        self.advisor = None

    # ---- forward ----------------------------------------------------------------------------
    def forward_begins(self) -> None:
        stall_beat.reached(self.counters.global_steps)   # --stall_timeout: a rank stuck in here falls behind
        if self.advisor is not None:
            self.advisor.forward_begins()
        self.progress.timers.start("forward")

    @contextlib.contextmanager
    def forward(self, args: tuple, kwargs: dict):
        """Around the module's forward: the input's tokens, the FLOPs count, the inf/NaN trace."""
        self.progress.saw_input(args)
        self.instruments.forward_begins(self.run, self.counters.global_steps, self.compiled(), args, kwargs)
        try:
            yield
        except BaseException:
            self.instruments.abandon_count()   # a script that catches this (OOM retries) keeps no counter running
            raise
        self.instruments.forward_done()

    def forward_done(self, output) -> None:
        self.hooks.mark(output)    # a plain loss.backward() is then routed through the engine
        self.progress.timers.stop("forward")

    # ---- backward ---------------------------------------------------------------------------
    def backward_begins(self, loss: torch.Tensor) -> None:
        stall_beat.reached(self.counters.global_steps)
        self.progress.timers.start("backward")
        self.progress.add_loss(loss)
        if self.advisor is not None:
            self.advisor.backward_begins()

    @contextlib.contextmanager
    def backward(self):
        """Around autograd: the output hooks stand aside (this is engine.backward); the count goes on."""
        self.hooks.inside_engine_backward = True
        self.instruments.backward_begins()
        try:
            yield
        except BaseException:
            self.instruments.abandon_count()
            raise
        finally:
            self.hooks.inside_engine_backward = False
        self.instruments.backward_done()

    def backward_done(self) -> None:
        self.progress.timers.stop("backward")

    # ---- step -------------------------------------------------------------------------------
    def step_reached(self) -> None:
        stall_beat.reached(self.counters.global_steps)

    @contextlib.contextmanager
    def step(self):
        """Around the optimizer step: its timer and count; fp16's stuck loss scale said with its cause."""
        if self.advisor is not None:
            self.advisor.step_begins()
        self.progress.timers.start("step")
        self.instruments.step_begins()
        with self.instruments.guard_step(self.run, self.counters.global_steps + 1):
            yield

    def step_done(self, facts: StepFacts) -> None:
        """The profile and a skipped step's diagnosis, then the metric events and the progress line."""
        if self.advisor is not None:   # first: it times the step alone, not the profile
            self.advisor.step_done(facts.skipped)
        self.instruments.after_step(self.run, facts)
        self.progress.timers.stop("step")
        events = self.instruments.event_values(facts, self.progress.tokens_per_sample)
        self.progress.after_step(dataclasses.replace(facts, events=events), self.memory)

    # ---- a pipeline batch -------------------------------------------------------------------
    def batch_begins(self) -> None:
        """A pipeline batch (train or eval) starts: one beat for its whole schedule, whose actions
        differ by stage (--stall_timeout compares ranks by batches and steps)."""
        stall_beat.reached(self.counters.global_steps)

    @contextlib.contextmanager
    def schedule(self, link):
        """Around a pipeline stage's schedule: its wall time and the time ``link`` (p2p.StageLink)
        spent blocked in receives, the stage's bubble (scripts/bench_pipeline.py reads them)."""
        started, link.recv_wait_s = time.perf_counter(), 0.0
        yield
        self.schedule_timing = {"wall_s": time.perf_counter() - started, "recv_wait_s": link.recv_wait_s}

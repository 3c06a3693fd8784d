"""Progress reporting of the data-parallel engine: the loss of the steps since the last report,
the phase timers, and what a boundary step prints and records.

The engine's StepObserver (step_observer.py) tells it what happened (an input's shape, a
micro-step's loss, a finished step); it
decides when to read the loss (a host sync) and what goes to the console and the metric files.
The engine's StepInstruments (instruments.py) adds its metric events to a step's facts, and its model
TFLOP/s and MFU to the printed line.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from launcher.zero.engine.monitor import Monitor, PhaseTimer, progress_line


@dataclass(frozen=True)
class StepFacts:
    """What the engine knows after a boundary step, for the progress line and the metric events."""

    step: int                      # global_steps
    samples: int                   # global_samples
    lrs: list                      # one learning rate per optimizer group
    loss_scale: float              # 1.0 without fp16
    fp16: bool                     # whether a loss scaler runs (its scale is then recorded)
    skipped: int                   # skipped_steps
    #: the step's global gradient norm: a float, a DeviceNorm not yet read, None after a skip
    grad_norm: Any = None
    #: more metric events of this step: the instruments' grad norm, samples/s, tokens/s, skipped steps
    events: dict = field(default_factory=dict)


class Progress:
    """The progress line, its rates and ETA, and the phase timers of one engine."""

    def __init__(self, config, monitor: Monitor, total_steps: int | None, synchronize=None, instruments=None):
        self.config = config
        self.monitor = monitor
        #: the engine's StepInstruments: ``progress_fields(samples/s)`` for the line, ``diagnosed`` once it explained
        #: the job's first non-finite step (a non-finite loss is then not warned of: the instruments said it)
        self.instruments = instruments
        self.timers = PhaseTimer(config.wall_clock_breakdown, synchronize)
        #: the progress line's "step=N/total" and ETA: a schedule's length, else what the script sets
        self.total_steps = total_steps
        self.tokens_per_sample: int | None = None
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0
        self._started = time.perf_counter()
        self._last_report = (self._started, 0)

    def saw_input(self, args: tuple) -> None:
        """Token ids (batch, sequence) as the first argument give the tokens/s of the line."""
        if args and torch.is_tensor(args[0]) and args[0].dim() >= 2 and not args[0].is_floating_point():
            self.tokens_per_sample = int(args[0].shape[1])

    def add_loss(self, loss: torch.Tensor) -> None:
        """A micro-step's loss, kept on the device until a report reads it."""
        detached = loss.detach().float()
        self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached
        self._loss_count += 1

    def pending_loss(self) -> tuple[torch.Tensor | None, int]:
        """The micro-step losses summed since the last step (a device tensor, not read) and their count."""
        return self._loss_sum, self._loss_count

    def after_step(self, facts: StepFacts, memory: Callable[[], dict[str, int]]) -> None:
        """Record the step's events; on every ``steps_per_print``-th step print the progress line."""
        every = self.config.steps_per_print
        printing = bool(every) and facts.step % every == 0
        loss = self._take_loss(read=printing or self.monitor.records, step=facts.step)
        values = {"Train/Samples/lr": facts.lrs[0]}
        if loss is not None:
            values["Train/Samples/train_loss"] = loss
        if facts.fp16:
            values["Train/Samples/loss_scale"] = facts.loss_scale
        values.update(facts.events)
        self.monitor.events(facts.samples, values)
        if printing:
            self._print(facts, loss, memory)

    def _take_loss(self, read: bool, step: int) -> float | None:
        """The mean loss since the last step, read (a host sync) only when asked; then forgotten."""
        loss = None
        if self._loss_sum is not None and read:
            loss = float(self._loss_sum.item()) / max(1, self._loss_count)
            if not math.isfinite(loss) and not self._explained():   # the instruments' message said it, for the job
                self.monitor.warn(f"loss is {loss} at step {step}")
        self._loss_sum, self._loss_count = None, 0
        return loss

    def _explained(self) -> bool:
        """Whether the instruments' diagnosis has said the job went non-finite (and where)."""
        return self.instruments is not None and self.instruments.diagnosed

    def _print(self, facts: StepFacts, loss: float | None, memory: Callable[[], dict[str, int]]) -> None:
        now = time.perf_counter()
        then, before = self._last_report
        rate = (facts.samples - before) / max(now - then, 1e-9)
        self._last_report = (now, facts.samples)
        lrs = ",".join(f"{lr:.4e}" for lr in dict.fromkeys(facts.lrs))
        values = {"loss": loss, "lr": lrs, "loss_scale": facts.loss_scale, "skipped": facts.skipped}
        throughput = self.instruments.progress_fields(rate) if self.instruments is not None else None
        self.monitor.log(progress_line(facts.step, self.total_steps, values, rate, self.tokens_per_sample,
                                       now - self._started, throughput))
        if self.config.wall_clock_breakdown:
            self.monitor.log(f"time (ms) | {self.timers.report()}")
        if self.config.memory_breakdown:
            self.monitor.log("memory (MiB) | " + " | ".join(f"{k}: {v / 2**20:.2f}" for k, v in memory().items()))

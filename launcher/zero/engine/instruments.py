"""What the engine watches besides the loss: FLOPs (the profiler, MFU) and the first non-finite step.

The engine's StepObserver (step_observer.py) calls one method at each point of the step (forward,
backward, optimizer step, report), with the facts it needs: an ``InstrumentedRun`` (what stays fixed:
the module, the loss scaler, the stage) and the step's numbers, never the engine itself. Each is
a few attribute reads unless something is due: a FLOPs count at one step (the profile
step, or the first step when the progress line has a peak to show MFU against), or a diagnosis
at the job's first step whose gradients hold inf/NaN.

What it watches must never fail the step nor change what runs (STYLE.md): a FLOPs count that
fails (a formula, the counter itself) or a profile that cannot be written is one warning, and
training goes on without MFU or the profile; the counted step runs eagerly past torch.compile and
the next step compiles (flops/counter.py says how). Deliberate stops stay stops: NonFiniteError
for ``non_finite.action: stop`` and fp16's loss scale stuck at its minimum.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from launcher.zero.distributed.parallel_layout import ParallelLayout
from launcher.zero.engine.nan_probe import Finding, probe
from launcher.zero.engine.nan_trace import NanTrace
from launcher.zero.errors import LossScaleAtMinimumError, NonFiniteError
from launcher.zero.flops.counter import CountFailure, FlopCount, FlopCounter, eager_counting_supported
from launcher.zero.flops.peak import peak_tflops, throughput_fields
from launcher.zero.flops.profiler import write_profile
from launcher.zero.flops.report import StepFacts, profile_text
from launcher.zero.precision.loss_scaler import LossScaler
from launcher.zero.stages.base import DeviceNorm

if TYPE_CHECKING:  # pragma: no cover
    from launcher.zero.engine.reporting import Progress, StepFacts as StepReport

STOP_HINT = 'the job stops on inf/NaN because "non_finite": {"action": "stop"}; lower the learning rate, ' \
            'check the named layer and the data of that step, or resume from the last checkpoint'


@dataclass(frozen=True)
class InstrumentedRun:
    """What the instruments read of an engine, fixed when the engine is built."""

    module: torch.nn.Module
    loss_scaler: LossScaler | None
    stage: int                  # ZeRO stage: a re-run's backward only below 3 (parameters stay gathered)
    micro_batch: int            # train_micro_batch_size_per_gpu, for the profile
    progress: "Progress"        # the step's summed losses (pending_loss) and tokens per sample


class StepInstruments:
    """One per engine; rank 0 prints, every rank takes part in a diagnosis (it may gather)."""

    def __init__(self, config, parallel: ParallelLayout, monitor, environ: dict[str, str]):
        self.config = config
        self.parallel = parallel       # the diagnosis gathers over its data axis (the ranks ZeRO spans)
        self.monitor = monitor
        self.rank = parallel.rank("data")
        self._profiling_step = False   # the FLOPs profile is being taken this step
        device = parallel.data.device
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        self.peak = peak_tflops(environ, name) if self.rank == 0 else None
        self._sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        profiler = config.flops_profiler
        self.profile_step = profiler.profile_step if profiler.enabled and self.rank == 0 else None
        self.count_step = self.profile_step if self.profile_step is not None else (0 if self.peak else None)
        self.counter = FlopCounter()
        self.flops_per_step: int | None = None
        self._times = {"forward": 0.0, "backward": 0.0, "step": 0.0}
        self._began = 0.0
        self._inputs = None
        self._skipped_seen = 0
        self._diagnosed = False
        self._at_min_scale = 0
        self._previous_loss = None          # (device tensor of summed micro-batch losses, count, step)
        self._clock = EventClock()
        self._trace: NanTrace | None = None   # hooks on every module, set at the first forward (nan_trace.py)
        self._tracing = config.non_finite.trace

    # ---- the step's points ----------------------------------------------------------------
    def forward_begins(self, run: InstrumentedRun, step: int, compiled: bool, args, kwargs) -> None:
        if self._tracing:
            self._trace_forward(run.module, compiled)
        elif self.config.non_finite.diagnose:
            self._inputs = (args, kwargs)   # references only: the re-run's inputs if this step goes non-finite
        if self._count_due(step, compiled) and not self.counter.start():
            self._count_failed(self.counter.failure)
        if self.counter.counting:
            self._sync()
            self._began = time.perf_counter()
            self.counter.forward_begins()

    def _trace_forward(self, module: torch.nn.Module, compiled: bool) -> None:
        """Hook the module at its first forward (not under torch.compile: hooks would change what
        compiles); then mark a new micro-batch."""
        if self._trace is None:
            if compiled:
                self._tracing = False
                return
            try:
                self._trace = NanTrace(module)
            except Exception as error:   # the trace is the instruments'; the step is the job's
                self._tracing = False
                self.monitor.warn(f"inf/NaN tracing off: {type(error).__name__}: {error}; training goes on")
                return
        self._trace.forward_begins()

    def stop_tracing(self) -> None:
        """Remove the trace's hooks (before engine.compile(), which must see the module as it is)."""
        if self._trace is not None:
            self._trace.remove()
        self._trace, self._tracing = None, False

    def _count_due(self, step: int, compiled: bool) -> bool:
        """Whether this forward starts the count: the count step's first micro-step, not yet counted."""
        if self.count_step is None or step != self.count_step or self.counter.counting \
                or self.flops_per_step is not None:
            return False
        if compiled and not eager_counting_supported():
            self.count_step = None
            self.monitor.warn(f"no MFU{' and no flops profile' if self.profile_step is not None else ''}: "
                              f"counting FLOPs would keep torch.compile from compiling on torch {torch.__version__} "
                              "(torch >= 2.6 counts one step eagerly and compiles the next); training goes on")
            return False
        return True

    def _count_failed(self, failure: CountFailure | None) -> None:
        """Say once that the count failed; no MFU and no profile from then on, the step goes on."""
        self.count_step, self.flops_per_step = None, None
        what = "MFU" + (" and the flops profile" if self.profile_step is not None else "")
        reason = failure.describe() if failure is not None else "counting FLOPs failed"
        self.monitor.warn(f"{reason}; training goes on without {what}")

    def abandon_count(self) -> None:
        """The counted forward or backward raised: stop counting, so no mode outlives the step."""
        if self.counter.counting:
            self.counter.stop()

    def forward_done(self) -> None:
        self._lap("forward")
        self.counter.forward_done()

    def backward_begins(self) -> None:
        if self.counter.counting:
            self._sync()
            self._began = time.perf_counter()

    def backward_done(self) -> None:
        self._lap("backward")

    def step_begins(self) -> None:
        if self.counter.counting:
            self._count = self.counter.stop()
            if self._count.failure is not None:
                self._count_failed(self._count.failure)
                return
            self.flops_per_step = self._count.total
            self._sync()
            self._began = time.perf_counter()
            self._profiling_step = True

    def _lap(self, phase: str) -> None:
        if self.counter.counting:
            self._sync()
            self._times[phase] += time.perf_counter() - self._began

    @contextlib.contextmanager
    def guard_step(self, run: InstrumentedRun, step: int):
        """Turn fp16's 'loss scale at its minimum' into a stop that says where the inf came from
        (``step``: the number of the step being taken)."""
        try:
            yield
        except LossScaleAtMinimumError as error:
            raise NonFiniteError(f"{error}\n{self._diagnosis(run, step)}",
                                 hint="the fp16 loss scale cannot go lower; try bf16, a lower learning rate, "
                                      "or check the named layer") from None

    def after_step(self, run: InstrumentedRun, facts: "StepReport") -> None:
        """A boundary step is done: the profile when it was counted; a skipped step's diagnosis."""
        try:
            self._after_step(run, facts)
        finally:
            if self._trace is not None:
                self._trace.reset()   # the step's reductions, unread when it went well
                if self._trace.error is not None:   # the trace's own failure: one warning, then no trace
                    self.monitor.warn(f"inf/NaN tracing off: {self._trace.error}; training goes on")
                    self.stop_tracing()

    def _after_step(self, run: InstrumentedRun, facts: "StepReport") -> None:
        if self._profiling_step:
            self._profiling_step = False
            self._sync()
            self._times["step"] = time.perf_counter() - self._began
            self._print_profile(run)
        skipped = facts.skipped > self._skipped_seen
        self._skipped_seen = facts.skipped
        if not skipped:
            self._previous_loss = (*run.progress.pending_loss(), facts.step)
            self._at_min_scale = 0
            return
        scaler = run.loss_scaler
        if scaler is not None:   # fp16 overflows are the loss scaler's business until it is stuck
            self._at_min_scale = self._at_min_scale + 1 if scaler.scale <= scaler.rules.min_scale else 0
            if self._at_min_scale >= self.config.non_finite.stuck_scale_steps:
                raise NonFiniteError(
                    "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.\n"
                    f"(fp16: {self._at_min_scale} overflowing steps in a row at min_loss_scale "
                    f"{scaler.rules.min_scale:g})\n{self._diagnosis(run, facts.step)}",
                    hint="the fp16 loss scale cannot go lower; try bf16, a lower learning rate, or check the named layer")
            return
        if self.config.non_finite.action == "stop":
            raise NonFiniteError(self._diagnosis(run, facts.step), hint=STOP_HINT)
        if not self._diagnosed:
            text = self._diagnosis(run, facts.step)
            if self.rank == 0:
                self.monitor.warn(text + '\nthe step was skipped (non_finite.action "skip"); later non-finite '
                                  'steps are counted in skipped= only')

    @property
    def diagnosed(self) -> bool:
        """Whether the job's first non-finite step has been explained (reporting.py then warns less)."""
        return self._diagnosed

    def progress_fields(self, samples_per_second: float) -> dict[str, str]:
        """Model TFLOP/s per rank and MFU for the progress line (empty until counted, or without a peak)."""
        steps_per_second = samples_per_second / max(self.config.train_batch_size or 1, 1)
        return throughput_fields(self.flops_per_step, steps_per_second, self.peak)

    def event_values(self, facts: "StepReport", tokens_per_sample: int | None) -> dict[str, float]:
        """Grad norm, samples/s, tokens/s and skipped steps for the metric files and services."""
        return self._clock.values(facts, tokens_per_sample) if self.monitor.records else {}

    # ---- the diagnosis ------------------------------------------------------------------------
    def _diagnosis(self, run: InstrumentedRun, step: int) -> str:
        """The job's first non-finite step, said once: every rank reads its trace (or re-runs its
        micro-batch where tracing is off), rank 0 tells."""
        if self._diagnosed:
            return f"non-finite loss or gradients at step {step} (where: said at the first one above)"
        self._diagnosed = True
        finding, error = self._where(run)
        previous = self._previous_loss
        mine = (finding, _mean(*run.progress.pending_loss()),
                _mean(previous[0], previous[1]) if previous else None, previous[2] if previous else None)
        gathered = self._gather(mine)
        losses = [(rank, entry[1]) for rank, entry in enumerate(gathered) if entry[1] is not None]
        bad = [(rank, loss) for rank, loss in losses if not math.isfinite(loss)]
        if bad:
            head = f"the loss itself was non-finite ({bad[0][1]} on rank {bad[0][0]})"
        elif losses:
            head = f"the loss was finite ({sum(l for _, l in losses) / len(losses):.6g}), its gradients were not"
        else:
            head = "the loss was not seen by engine.backward"
        lines = [f"non-finite gradients at step {step}: {head}"]
        found = [entry[0] for entry in gathered if entry[0] is not None]
        if found:   # the earliest micro-batch, its forward before its backward, then the lowest rank
            lines.append(min(found, key=lambda f: (f.micro_batch or 0, f.phase != "forward", f.rank)).describe())
        elif error:
            lines.append(f"the search for the module could not look: {error}")
        elif self._trace is not None:
            lines.append("no module's output or output gradient went non-finite on any rank (the inf/NaN came "
                         "from code outside the modules: the loss function, or the gradients' reduction)")
        elif self.config.non_finite.diagnose:
            lines.append("a re-run of the step's last micro-batch stayed finite on every rank (the inf/NaN came "
                         "from an earlier micro-batch of the step, or does not repeat); to see it during the "
                         "step: \"non_finite\": {\"trace\": true} (about 5% of a step on an H100)")
        lasts = [entry[2] for entry in gathered if entry[2] is not None]
        if lasts and all(math.isfinite(v) for v in lasts):
            lines.append(f"last finite loss: {sum(lasts) / len(lasts):.6g} at step {gathered[0][3]} (mean over ranks)")
        else:
            lines.append("last finite loss: none seen before this step")
        return "\n".join(lines)

    def _where(self, run: InstrumentedRun) -> tuple[Finding | None, str | None]:
        """This rank's first non-finite module: from the step's trace, else (tracing off) a re-run of
        the last micro-batch; or why it could not look."""
        try:
            if self._trace is not None:
                if self._trace.error is not None:
                    return None, self._trace.error
                found = self._trace.finding()
                return (Finding(self.rank, found.phase, found.module, found.module_type, None,
                                micro_batch=found.micro_batch, micro_batches=found.micro_batches,
                                after=found.after) if found else None), None
            if self.config.non_finite.diagnose and self._inputs is not None:
                factor = run.loss_scaler.scale if run.loss_scaler is not None else 1.0
                return probe(run.module, self._inputs, self.rank, factor, backward=run.stage < 3), None
        except Exception as failure:   # the diagnosis must never hide the step's own story
            return None, f"{type(failure).__name__}: {failure}"
        return None, None

    def _gather(self, mine: tuple) -> list[tuple]:
        """Every rank's (finding, loss, last loss, its step), in rank order."""
        if self.parallel.size("data") == 1:
            return [mine]
        gathered = [None] * self.parallel.size("data")
        torch.distributed.all_gather_object(gathered, mine, group=self.parallel.group("data"))
        return gathered

    # ---- the profile ------------------------------------------------------------------------
    def _print_profile(self, run: InstrumentedRun) -> None:
        if self.profile_step is None:
            return
        section = self.config.flops_profiler
        count: FlopCount = self._count
        facts = StepFacts(step=self.profile_step, params=sum(p.numel() for p in run.module.parameters()),
                          world_size=self.parallel.size("data"), micro_batch=run.micro_batch,
                          forward_s=self._times["forward"], backward_s=self._times["backward"],
                          step_s=self._times["step"])
        types = {name: type(m).__name__ for name, m in run.module.named_modules()}
        try:
            write_profile(profile_text(count, facts, section.module_depth, section.top_modules, section.detailed,
                                       types), section.output_file)
        except Exception as error:   # the profile is the watcher's; the step is the job's
            self.monitor.warn(f"flops profile of step {self.profile_step} not written "
                              f"({section.output_file or 'stdout'}): {type(error).__name__}: {error}; training goes on")


def _mean(total, count) -> float | None:
    if total is None or not count:
        return None
    return float(total.item()) / count


class EventClock:
    """Per-step rates for the metric events (the progress line keeps its own, between prints)."""

    def __init__(self):
        self._last: tuple[float, int] | None = None

    def values(self, facts: "StepReport", tokens_per_sample: int | None) -> dict[str, float]:
        now, samples = time.perf_counter(), facts.samples
        values = {"Train/Samples/skipped_steps": float(facts.skipped)}
        norm = facts.grad_norm.value() if isinstance(facts.grad_norm, DeviceNorm) else facts.grad_norm
        if norm is not None:
            values["Train/Samples/grad_norm"] = float(norm)
        if self._last is not None and now > self._last[0]:
            rate = (samples - self._last[1]) / (now - self._last[0])
            values["Train/Samples/samples_per_second"] = rate
            if tokens_per_sample:
                values["Train/Samples/tokens_per_second"] = rate * tokens_per_sample
        self._last = (now, samples)
        return values

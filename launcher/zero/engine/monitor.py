"""What users see while training: the progress line, phase timers and metric files.

Rank 0 writes; the other ranks stay quiet except for warnings about their own state.
"""
from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from launcher.zero.engine.metric_services import open_services


class PhaseTimer:
    """Accumulates wall-clock seconds per phase (forward, backward, step) between reports."""

    def __init__(self, enabled: bool, synchronize=None):
        self.enabled = enabled
        self.synchronize = synchronize
        self.totals: dict[str, float] = {}
        self._start: dict[str, float] = {}

    def start(self, phase: str) -> None:
        if self.enabled:
            if self.synchronize:
                self.synchronize()
            self._start[phase] = time.perf_counter()

    def stop(self, phase: str) -> None:
        if self.enabled and phase in self._start:
            if self.synchronize:
                self.synchronize()
            self.totals[phase] = self.totals.get(phase, 0.0) + time.perf_counter() - self._start.pop(phase)

    def report(self) -> str:
        text = " | ".join(f"{phase}: {seconds * 1000:.2f} ms" for phase, seconds in self.totals.items())
        self.totals = {}
        return text


def progress_line(step: int, total: int | None, values: dict, rate: float, tokens_per_sample: int | None,
                  elapsed: float, throughput: dict[str, str] | None = None) -> str:
    """One progress line: ``key=value`` tokens without spaces inside values, so ``dict(t.split("=", 1) for
    t in line.split()[1:])`` parses it; steps done / total, ETA, loss, lr, loss scale, samples/s, tokens/s,
    and ``throughput``'s tokens (model TFLOP/s and MFU) after them.
    """
    done = f"{step}/{total}" if total else str(step)
    parts = [f"step={done}"]
    for key in ("loss", "lr", "loss_scale", "skipped"):
        value = values.get(key)
        if value is not None:
            parts.append(f"{key}={value if isinstance(value, str) else _number(value)}")
    parts.append(f"samples/s={rate:.1f}")
    if tokens_per_sample:
        parts.append(f"tokens/s={rate * tokens_per_sample:.0f}")
    parts.extend(f"{key}={value}" for key, value in (throughput or {}).items())
    parts.append(f"elapsed={_duration(elapsed)}")
    if total and step and total > step:
        parts.append(f"eta={_duration(elapsed / step * (total - step))}")
    return "progress " + " ".join(parts)


def ready_line(stage: int, precision: str, world_size: int, params: int, memory: dict[str, int]) -> str:
    """The first line, as soon as the engine is ready: what runs where, and the bytes each rank holds."""
    held = ",".join(f"{k}:{v / 2**20:.1f}" for k, v in memory.items() if k != "total")
    return (f"ready stage={stage} precision={precision} world_size={world_size} params={params} "
            f"memory_per_rank_mib={memory.get('total', 0) / 2**20:.1f} breakdown_mib={held}")


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.4e}" if value and abs(value) < 1e-2 else f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Monitor:
    """Rank-0 console lines and CSV / TensorBoard / W&B / Comet events (the config's monitor sections).

    A writer is a watcher: one that fails (its folder gone, a full disk, the service's network)
    costs one warning naming it and is dropped; the step and the other writers go on."""

    def __init__(self, config, rank: int, out: TextIO | None = None, err: TextIO | None = None):
        self.rank = rank
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.csv_dir = None
        self.tensorboard = None
        self.services: list = []   # wandb, comet (metric_services.py)
        if rank != 0:
            return
        if config.csv_monitor.enabled:
            path = os.path.join(config.csv_monitor.output_path or "csv_monitor", config.csv_monitor.job_name)
            if self._guarded("csv_monitor", "open", os.makedirs, path, exist_ok=True):
                self.csv_dir = path
        if config.tensorboard.enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self.warn("tensorboard.enabled is set but the tensorboard package is not installed; "
                          "pip install tensorboard (continuing without it)")
            else:
                path = os.path.join(config.tensorboard.output_path or "runs", config.tensorboard.job_name)
                self._guarded("tensorboard", "open", self._open_tensorboard, SummaryWriter, path)
        self.services = open_services(config, self.warn)

    def _open_tensorboard(self, writer_class, path: str) -> None:
        self.tensorboard = writer_class(log_dir=path)

    def _guarded(self, name: str, doing: str, work, *args, **kwargs) -> bool:
        """Run a writer's ``work``; on any error warn once, naming the writer, and say False."""
        try:
            work(*args, **kwargs)
            return True
        except Exception as error:
            self.warn(f"{name}: could not {doing} ({type(error).__name__}: {error}); training goes on without it")
            return False

    @property
    def records(self) -> bool:
        """Whether ``events`` writes anywhere (so the engine reads the loss for it)."""
        return self.rank == 0 and (self.csv_dir is not None or self.tensorboard is not None or bool(self.services))

    def log(self, text: str) -> None:
        if self.rank == 0:
            print(f"[zero] {text}", file=self.out, flush=True)

    def warn(self, text: str) -> None:
        print(f"[zero] rank {self.rank}: warning: {text}", file=self.err, flush=True)

    def events(self, step: int, values: dict[str, float]) -> None:
        """One value per event name at ``step`` (DeepSpeed names, e.g. ``Train/Samples/train_loss``)."""
        if self.rank != 0:
            return
        doing = f"write the metrics of sample {step}"
        if self.csv_dir and not self._guarded("csv_monitor", doing, self._write_csv, step, values):
            self.csv_dir = None
        if self.tensorboard is not None and not self._guarded("tensorboard", doing, self._write_tensorboard,
                                                              step, values):
            self.tensorboard = None
        for service in list(self.services):
            if not self._guarded(type(service).__name__, doing, service.write, step, values):
                self.services.remove(service)

    def _write_csv(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            path = os.path.join(self.csv_dir, name.replace("/", "_") + ".csv")
            fresh = not os.path.exists(path)
            with open(path, "a", encoding="utf-8") as handle:
                if fresh:
                    handle.write("step,value\n")
                handle.write(f"{step},{value}\n")

    def _write_tensorboard(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.tensorboard.add_scalar(name, value, step)
        self.tensorboard.flush()

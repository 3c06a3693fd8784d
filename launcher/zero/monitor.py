"""What users see while training: the progress line, phase timers and metric files.

Rank 0 writes; the other ranks stay quiet except for warnings about their own state.
"""
from __future__ import annotations

import os
import sys
import time
from typing import TextIO


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


class Monitor:
    """Rank-0 console lines and CSV / TensorBoard events (``csv_monitor``, ``tensorboard`` keys)."""

    def __init__(self, config, rank: int, out: TextIO | None = None, err: TextIO | None = None):
        self.rank = rank
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.csv_dir = None
        self.tensorboard = None
        if rank != 0:
            return
        if config.csv_monitor.enabled:
            self.csv_dir = os.path.join(config.csv_monitor.output_path or "csv_monitor", config.csv_monitor.job_name)
            os.makedirs(self.csv_dir, exist_ok=True)
        if config.tensorboard.enabled:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self.warn("tensorboard.enabled is set but the tensorboard package is not installed; "
                          "pip install tensorboard (continuing without it)")
            else:
                path = os.path.join(config.tensorboard.output_path or "runs", config.tensorboard.job_name)
                self.tensorboard = SummaryWriter(log_dir=path)

    def log(self, text: str) -> None:
        if self.rank == 0:
            print(f"[zero] {text}", file=self.out, flush=True)

    def warn(self, text: str) -> None:
        print(f"[zero] rank {self.rank}: warning: {text}", file=self.err, flush=True)

    def events(self, step: int, values: dict[str, float]) -> None:
        """One value per event name at ``step`` (DeepSpeed names, e.g. ``Train/Samples/train_loss``)."""
        if self.rank != 0:
            return
        if self.csv_dir:
            for name, value in values.items():
                path = os.path.join(self.csv_dir, name.replace("/", "_") + ".csv")
                fresh = not os.path.exists(path)
                with open(path, "a", encoding="utf-8") as handle:
                    if fresh:
                        handle.write("step,value\n")
                    handle.write(f"{step},{value}\n")
        if self.tensorboard is not None:
            for name, value in values.items():
                self.tensorboard.add_scalar(name, value, step)
            self.tensorboard.flush()

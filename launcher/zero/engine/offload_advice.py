"""The arithmetic of optimizer offload's advice lines (issue 43): pure, no clock, no tensors.

Where the host cannot run Adam in the time of a forward and backward, offload's step is bound by
the host's memory bandwidth: each offloaded parameter's update reads its master, gradient and two
moments and writes the master and moments back, and the updated master is read once more by the
copy to the device. ``bytes_per_parameter`` counts those bytes, ``least_host_seconds`` turns them
into the least host time a step can take at a measured bandwidth. Once steps have run,
``slowdown`` is the expected step time over no offload's, and ``hiding_ratio`` the
``offload_optimizer.ratio`` whose host step fits in the forward and backward (the host time
shrinks with the offloaded share; with ``overlap_step`` the step then hides behind the next
forward and backward).

Glossary: *fb*: the training thread's forward and backward time of one optimizer step (every
micro-step of the accumulation, waits for a background step taken out); *host*: the offloaded
update's time (the CPU Adam and the uploads).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field


def bytes_per_parameter(master: int = 4, grad: int = 4, moment: int = 4) -> int:
    """Host memory bytes one offloaded parameter's update moves, for element sizes in bytes: reads of
    the master, gradient and both moments, writes of the master and both moments, and the upload's
    read of the master (fp32 states: 32)."""
    reads = master + grad + 2 * moment
    writes = master + 2 * moment
    return reads + writes + master


def least_host_seconds(offloaded: int, per_parameter: int, bandwidth: float) -> float:
    """The least host time of one step: ``offloaded`` parameters' bytes at ``bandwidth`` bytes/s."""
    return offloaded * per_parameter / bandwidth if bandwidth > 0 else float("inf")


def slowdown(fb: float, host: float, overlap: bool) -> float:
    """Expected step time over no offload's (whose step is about its forward and backward): the
    host step after the forward and backward, or beside the next ones with ``overlap_step``."""
    if fb <= 0:
        return float("inf")
    return max(fb, host) / fb if overlap else (fb + host) / fb


def hiding_ratio(fb: float, host: float, offloaded_share: float) -> float:
    """The ``offload_optimizer.ratio`` whose host step fits in ``fb``: the host time scales with the
    offloaded share (``host`` was measured at ``offloaded_share``), so ``share * fb / host``, at most 1."""
    if host <= 0:
        return 1.0
    return max(0.0, min(1.0, offloaded_share * fb / host))


def start_line(bandwidth: float, copied: int, per_parameter: int, offloaded: int, least: float) -> str:
    """The engine's start line: the host-side bound for this rank."""
    return (f"offload: host memory bandwidth {bandwidth / 1e9:.1f} GB/s (a {copied / 2**20:.0f} MiB copy); the CPU "
            f"Adam moves {per_parameter} B a parameter (reads master, gradient, 2 moments; writes master, "
            f"2 moments; the upload reads the master), so this rank's {offloaded:,} offloaded parameters "
            f"need at least {least * 1000:.2f} ms of host time a step")


def measured_line(steps: int, fb: float, host: float, least: float, overlap: bool, ratio: float, hiding: float) -> str:
    """The line after the first timed steps: what was measured and what ``ratio`` would hide the step."""
    where = "beside the next forward and backward (overlap_step)" if overlap else "after the backward"
    advice = (f"offload_optimizer.ratio {hiding:.2f} would fit the host step in the forward and backward"
              + ("" if overlap else " (with overlap_step on, to run it beside them)"))
    return (f"offload: over {steps} steps forward+backward {fb * 1000:.2f} ms, host step {host * 1000:.2f} ms "
            f"(bound {least * 1000:.2f} ms) {where}: about {slowdown(fb, host, overlap):.2f}x the step time of no "
            f"offload at ratio {ratio:g}; {advice}")


@dataclass
class StepSamples:
    """The first steps' times: the first ``skip`` dropped (warm-up), then ``count`` kept; medians."""

    count: int = 10
    skip: int = 1
    fb: list = field(default_factory=list)
    host: list = field(default_factory=list)
    seen: int = 0

    def add(self, fb: float, host: float) -> bool:
        """One step's times; True once, when the last one wanted has come."""
        self.seen += 1
        if self.seen <= self.skip or len(self.fb) >= self.count:
            return False
        self.fb.append(fb)
        self.host.append(host)
        return len(self.fb) == self.count

    def medians(self) -> tuple[float, float]:
        return statistics.median(self.fb), statistics.median(self.host)

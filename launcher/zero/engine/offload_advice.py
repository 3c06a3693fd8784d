"""The arithmetic of optimizer offload's advice lines (issue 43): pure, no clock, no tensors.

Where the host cannot run Adam in the time of a forward and backward, offload's step is bound by
the host's memory bandwidth: each offloaded parameter's update reads its master, gradient and two
moments and writes the master and moments back, and the updated master is read once more by the
copy to the device. ``bytes_per_parameter`` counts those bytes, ``least_host_seconds`` turns them
into the least host time a step can take at a measured bandwidth. Once steps have run,
``slowdown`` is the expected step time over no offload's, and ``hiding_ratio`` the
``offload_optimizer.ratio`` whose host step fits in the forward (the host time shrinks with the
offloaded share). The host step cannot start before the backward ends: clipping needs the norm
of every gradient. So with ``overlap_step`` it runs beside the next *forward* only (each module
waits for its updated weights), not beside the backward: a step takes backward + max(forward,
host). On one H100 (2026-12-07, 406M GPT, stage 2, overlap_step) the earlier model, max(forward
+ backward, host), said 1.0x where 0.61x was measured; this one says 0.62x.

Glossary: *fb*: the training thread's forward and backward time of one optimizer step (every
micro-step of the accumulation, waits for a background step taken out); *backward*: the part of
fb spent in the backward; *forward*: the rest, fb - backward; with overlap_step the forward is
paced by the host step, so its own time is taken as at most half the backward's (a forward does
half a backward's arithmetic); *host*: the offloaded update's time (the CPU Adam and the uploads).
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


def forward_seconds(fb: float, backward: float, overlap: bool) -> float:
    """The forward's own time: fb - backward, at most half the backward with ``overlap_step`` (there
    the forward waits for each module's update, so what was measured may be the host's pace).
    ``backward`` 0 (not measured): two thirds of fb are taken as the backward."""
    backward = backward if backward > 0 else 2 * fb / 3
    forward = max(0.0, fb - backward)
    return min(forward, backward / 2) if overlap else forward


def slowdown(fb: float, backward: float, host: float, overlap: bool) -> float:
    """Expected step time over no offload's (whose step is about its forward and backward): the
    host step after the forward and backward, or with ``overlap_step`` beside the next forward."""
    if fb <= 0:
        return float("inf")
    if not overlap:
        return (fb + host) / fb
    forward = forward_seconds(fb, backward, overlap)
    backward = fb - forward if backward <= 0 else backward
    return (backward + max(forward, host)) / (backward + forward)


def hiding_ratio(forward: float, host: float, offloaded_share: float) -> float:
    """The ``offload_optimizer.ratio`` whose host step fits in the ``forward``: the host time scales
    with the offloaded share (``host`` was measured at ``offloaded_share``), so ``share * forward /
    host``, at most 1."""
    if host <= 0:
        return 1.0
    return max(0.0, min(1.0, offloaded_share * forward / host))


def start_line(bandwidth: float, copied: int, per_parameter: int, offloaded: int, least: float) -> str:
    """The engine's start line: the host-side bound for this rank."""
    return (f"offload: host memory bandwidth {bandwidth / 1e9:.1f} GB/s (a {copied / 2**20:.0f} MiB copy); the CPU "
            f"Adam moves {per_parameter} B a parameter (reads master, gradient, 2 moments; writes master, "
            f"2 moments; the upload reads the master), so this rank's {offloaded:,} offloaded parameters "
            f"need at least {least * 1000:.2f} ms of host time a step")


def measured_line(steps: int, fb: float, backward: float, host: float, least: float, overlap: bool, ratio: float,
                  hiding: float) -> str:
    """The line after the first timed steps: what was measured and what ``ratio`` would hide the step."""
    where = ("beside the next forward (overlap_step; it waits for the backward's last gradient)" if overlap
             else "after the backward")
    advice = (f"offload_optimizer.ratio {hiding:.2f} would fit the host step in the forward"
              + ("" if overlap else " (with overlap_step on, to run it beside it)"))
    return (f"offload: over {steps} steps forward+backward {fb * 1000:.2f} ms (backward {backward * 1000:.2f}), "
            f"host step {host * 1000:.2f} ms (bound {least * 1000:.2f} ms) {where}: about "
            f"{slowdown(fb, backward, host, overlap):.2f}x the step time of no offload at ratio {ratio:g}; {advice}")


@dataclass
class StepSamples:
    """The first steps' times: the first ``skip`` dropped (warm-up), then ``count`` kept; medians."""

    count: int = 10
    skip: int = 1
    fb: list = field(default_factory=list)
    host: list = field(default_factory=list)
    backward: list = field(default_factory=list)
    seen: int = 0

    def add(self, fb: float, host: float, backward: float = 0.0) -> bool:
        """One step's times; True once, when the last one wanted has come."""
        self.seen += 1
        if self.seen <= self.skip or len(self.fb) >= self.count:
            return False
        self.fb.append(fb)
        self.host.append(host)
        self.backward.append(backward)
        return len(self.fb) == self.count

    def medians(self) -> tuple[float, float, float]:
        """(fb, host, backward) medians."""
        return statistics.median(self.fb), statistics.median(self.host), statistics.median(self.backward)

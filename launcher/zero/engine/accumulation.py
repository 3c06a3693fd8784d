"""Gradient accumulation: which micro-step ends an accumulation and triggers the optimizer step.

A micro-step is one ``forward``/``backward``/``step`` call triple; every
``gradient_accumulation_steps``-th one is the *boundary*, where ``engine.step()`` updates the
model. A script may override the next answer (``set_gradient_accumulation_boundary``), and a
config that leaves the accumulation to the script (``managed_gradient_accumulation`` false)
makes every micro-step a boundary.
"""
from __future__ import annotations


class Accumulation:
    """The micro-step counter and the boundary rule of one engine."""

    def __init__(self, steps: int, managed: bool = True):
        self.steps = steps                  # gradient_accumulation_steps
        self.managed = managed
        self.micro_steps = 0                # micro-steps done since the start (a checkpoint restores it)
        self._override: bool | None = None  # the script's answer for the current micro-step

    def is_boundary(self) -> bool:
        """Whether the current micro-step ends an accumulation."""
        if self._override is not None:
            return self._override
        if not self.managed:
            return True
        return (self.micro_steps + 1) % self.steps == 0

    def set_boundary(self, is_boundary: bool) -> None:
        """The script decides for the current micro-step (until ``engine.step()`` ends it)."""
        self._override = is_boundary

    def advance(self) -> None:
        """``engine.step()`` ended the micro-step: count it and drop the script's override."""
        self.micro_steps += 1
        self._override = None

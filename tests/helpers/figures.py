"""What a test may say about a measured speed, rate or duration: that it is there and is a number.

How fast a step ran depends on the machine and on what else runs on it (CI's 2 shared cores, at
times loaded), so no test asserts that a figure is large, small or even above zero: a rate
rounded at a fixed number of decimals reads 0.0 on a slow enough run. ``None`` is the scripts'
"not measured", which a test accepts.
"""
from __future__ import annotations

import math


def is_figure(value) -> bool:
    """A finite number >= 0 (bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def is_figure_or_unmeasured(value) -> bool:
    """A figure, or None: the script's "not measured"."""
    return value is None or is_figure(value)

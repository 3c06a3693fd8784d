"""Learning-rate schedules: pure formulas (formulas.py) and DeepSpeed-named scheduler objects."""
from launcher.zero.sched.schedulers import (  # noqa: F401
    SCHEDULERS, LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR,
)
from launcher.zero.sched.by_name import build_scheduler  # noqa: F401

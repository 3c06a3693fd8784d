"""``deepspeed.runtime.lr_schedules``: DeepSpeed's schedulers under their DeepSpeed names."""
from launcher.zero.sched.schedulers import (  # noqa: F401
    LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR,
)

LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR = (
    "LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]

"""DeepSpeed 0.19.8's learning-rate schedules as pure functions of the step t (deepspeed/runtime/lr_schedules.py).

``t`` is DeepSpeed's ``last_batch_iteration``: -1 right after construction, then 0, 1, 2, ...
after each ``step()``. Each function returns the value for one param group.
"""
from __future__ import annotations

import math


def warmup_gamma(t: int, warmup_num_steps: int, warmup_type: str) -> float:
    """Warmup progress in [0, 1]: log or linear in t, 1 once warmup is over."""
    n = max(2, warmup_num_steps)
    if t >= n:
        return 1.0
    if warmup_type == "linear":
        return t / n
    return math.log(t + 1) / math.log(n)


def warmup_lr(t: int, min_lr: float, max_lr: float, warmup_num_steps: int = 1000,
              warmup_type: str = "log") -> float:
    """WarmupLR: from min_lr to max_lr over warmup_num_steps, then constant."""
    if t < 0:
        return min_lr
    return min_lr + (max_lr - min_lr) * warmup_gamma(t, warmup_num_steps, warmup_type)


def warmup_decay_lr(t: int, min_lr: float, max_lr: float, total_num_steps: int,
                    warmup_num_steps: int = 1000, warmup_type: str = "log") -> float:
    """WarmupDecayLR: WarmupLR's warmup, then linear decay to min_lr at total_num_steps."""
    if t < 0:
        return min_lr
    n = max(2, warmup_num_steps)
    if t < n:
        gamma = warmup_gamma(t, warmup_num_steps, warmup_type)
    else:
        gamma = max(0.0, (total_num_steps - t) / max(1.0, total_num_steps - n))
    return min_lr + (max_lr - min_lr) * gamma


def warmup_cosine_ratio(t: int, total_num_steps: int, warmup_min_ratio: float = 0.0,
                        warmup_num_steps: int = 1000, cos_min_ratio: float = 1e-4,
                        warmup_type: str = "log") -> float:
    """WarmupCosineLR's multiplier of each group's original lr (0.19.8 clamps progress at 1)."""
    if t < 0:
        return 0.0
    n = warmup_num_steps
    if t < n:
        if warmup_type == "linear":
            gamma = t / n
        else:
            gamma = math.log(t + 1) / math.log(n) if n > 1 else 1.0
        return warmup_min_ratio + gamma * (1.0 - warmup_min_ratio)
    progress = min(1.0, (t - n + 1) / max(1, total_num_steps - n))
    return max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * (1.0 + math.cos(math.pi * progress)) / 2.0)


def lr_range_test_lr(t: int, min_lr: float, step_size: int = 2000, step_rate: float = 1.0,
                     staircase: bool = False) -> float:
    """LRRangeTest: linear growth of min_lr by step_rate per step_size steps."""
    interval = math.floor((t + 1) / step_size) if staircase else (t + 1) / step_size
    return min_lr * (1.0 + step_rate * interval)


def one_cycle_scale(t: int, first_step_size: int, second_step_size: int,
                    first_stair_count: int = 0, second_stair_count: int = 0) -> float:
    """OneCycle's position in the cycle: 0 -> 1 over the first phase, 1 -> 0 over the second."""
    total = first_step_size + second_step_size
    step_ratio = first_step_size / total
    batch = t + 1
    cycle = math.floor(1 + batch / total)
    x = 1.0 + batch / total - cycle
    if x <= step_ratio:
        scale, stairs = x / step_ratio, first_stair_count
    else:
        scale, stairs = (x - 1) / (step_ratio - 1), second_stair_count
    if stairs > 0:
        in_cycle = batch % total
        if in_cycle <= first_step_size:
            position = in_cycle * stairs / first_step_size
        else:
            position = (total - in_cycle) * stairs / second_step_size
        scale = math.floor(position) / stairs
    return scale


def one_cycle_lr(t: int, min_lr: float, max_lr: float, first_step_size: int = 2000,
                 second_step_size: int | None = None, first_stair_count: int = 0,
                 second_stair_count: int | None = None, decay_lr_rate: float = 0.0,
                 decay_step_size: int = 0) -> float:
    """OneCycle learning rate: one triangle from min_lr to max_lr and back, then decay."""
    second = first_step_size if second_step_size is None else second_step_size
    stairs2 = first_stair_count if second_stair_count is None else second_stair_count
    total = first_step_size + second
    if t < total:
        scale = one_cycle_scale(t, first_step_size, second, first_stair_count, stairs2)
        return min_lr + (max_lr - min_lr) * scale
    if decay_step_size == 0 or decay_lr_rate == 0:
        return min_lr
    decay_steps = t - total + 1
    return min_lr / (1.0 + decay_lr_rate * decay_steps / decay_step_size)


def one_cycle_momentum(t: int, min_mom: float, max_mom: float, first_step_size: int = 2000,
                       second_step_size: int | None = None, first_stair_count: int = 0,
                       second_stair_count: int | None = None, decay_mom_rate: float = 0.0,
                       decay_step_size: int = 0) -> float:
    """OneCycle momentum (beta1): mirrors the lr, max_mom -> min_mom -> max_mom, then decay."""
    second = first_step_size if second_step_size is None else second_step_size
    stairs2 = first_stair_count if second_stair_count is None else second_stair_count
    total = first_step_size + second
    if t < 0:
        return min_mom  # DeepSpeed initialises the betas to min_mom
    if t < total:
        scale = one_cycle_scale(t, first_step_size, second, first_stair_count, stairs2)
        return max_mom - (max_mom - min_mom) * scale
    if decay_step_size == 0 or decay_mom_rate == 0:
        return max_mom
    decay_steps = t - total + 1
    return max_mom * (1.0 + decay_mom_rate * decay_steps / decay_step_size)

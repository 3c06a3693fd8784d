"""Torch-compatible scheduler objects over the pure formulas, with DeepSpeed's names and arguments.

Each writes ``lr`` (and OneCycle's beta1) into every optimizer param group on construction
(t = -1) and on each ``step()`` (t += 1), exactly as DeepSpeed's lr_schedules do.
"""
from __future__ import annotations

from typing import Any, Sequence

from launcher.zero.sched import formulas


def _per_group(value: Any, count: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"{name}: expected {count} values (one per param group), got {len(value)}")
        return list(value)
    return [value] * count


class FormulaScheduler:
    """Base: subclasses implement ``values(t)`` (one lr per group)."""

    def __init__(self, optimizer, last_batch_iteration: int = -1):
        self.optimizer = optimizer
        self.last_batch_iteration = last_batch_iteration
        self._last_lr: list[float] = []
        self._apply()

    def values(self, t: int) -> list[float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def get_lr(self) -> list[float]:
        return self.values(self.last_batch_iteration)

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = (self.last_batch_iteration + 1 if last_batch_iteration is None
                                     else last_batch_iteration)
        self._apply()

    def _apply(self) -> None:
        lrs = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, lrs):
            current = group["lr"]
            if hasattr(current, "fill_"):  # tensor lrs are filled in place
                current.fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = lrs

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]
        self._apply()


class WarmupLR(FormulaScheduler):
    """Warm up from warmup_min_lr to warmup_max_lr (None: each group's lr), then constant."""

    def __init__(self, optimizer, warmup_min_lr: float | Sequence = 0.0, warmup_max_lr: float | Sequence | None = None,
                 warmup_num_steps: int = 1000, warmup_type: str = "log", last_batch_iteration: int = -1):
        count = len(optimizer.param_groups)
        if warmup_max_lr is None:
            warmup_max_lr = [float(group["lr"]) for group in optimizer.param_groups]
        self.min_lrs = _per_group(warmup_min_lr, count, "warmup_min_lr")
        self.max_lrs = _per_group(warmup_max_lr, count, "warmup_max_lr")
        self.warmup_num_steps = warmup_num_steps
        self.warmup_type = warmup_type if warmup_type in ("log", "linear") else "log"
        super().__init__(optimizer, last_batch_iteration)

    def values(self, t: int) -> list[float]:
        return [formulas.warmup_lr(t, low, high, self.warmup_num_steps, self.warmup_type)
                for low, high in zip(self.min_lrs, self.max_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then linear decay to warmup_min_lr at total_num_steps."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_lr: float | Sequence = 0.0,
                 warmup_max_lr: float | Sequence = 0.001, warmup_num_steps: int = 1000,
                 warmup_type: str = "log", last_batch_iteration: int = -1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)

    def values(self, t: int) -> list[float]:
        return [formulas.warmup_decay_lr(t, low, high, self.total_num_steps, self.warmup_num_steps,
                                         self.warmup_type) for low, high in zip(self.min_lrs, self.max_lrs)]


class WarmupCosineLR(FormulaScheduler):
    """A ratio of each group's original lr: warmup, then cosine down to cos_min_ratio."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 1e-4, warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = warmup_num_steps
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type if warmup_type in ("log", "linear") else "log"
        self.org_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        super().__init__(optimizer, last_batch_iteration)

    def values(self, t: int) -> list[float]:
        ratio = formulas.warmup_cosine_ratio(t, self.total_num_steps, self.warmup_min_ratio,
                                             self.warmup_num_steps, self.cos_min_ratio, self.warmup_type)
        return [lr * ratio for lr in self.org_lrs]

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration, "org_lrs": self.org_lrs}

    def load_state_dict(self, state: dict) -> None:
        self.org_lrs = list(state.get("org_lrs", self.org_lrs))
        super().load_state_dict(state)


class LRRangeTest(FormulaScheduler):
    """Grow the lr linearly (optionally in stairs) from lr_range_test_min_lr."""

    def __init__(self, optimizer, lr_range_test_min_lr: float | Sequence = 1e-3, lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1):
        if not isinstance(lr_range_test_step_size, int) or lr_range_test_step_size < 1:
            raise ValueError("lr_range_test_step_size must be a positive integer")
        self.min_lrs = _per_group(lr_range_test_min_lr, len(optimizer.param_groups), "lr_range_test_min_lr")
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        super().__init__(optimizer, last_batch_iteration)

    def values(self, t: int) -> list[float]:
        return [formulas.lr_range_test_lr(t, low, self.step_size, self.step_rate, self.staircase)
                for low in self.min_lrs]


class OneCycle(FormulaScheduler):
    """One lr triangle (and the mirrored beta1 when cycle_momentum), then decay.

    Unlike DeepSpeed, the group's own beta2 is kept (DeepSpeed writes betas=(mom, 0.99)).
    """

    def __init__(self, optimizer, cycle_min_lr: float, cycle_max_lr: float, decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None,
                 decay_step_size: int = 0, cycle_momentum: bool = True, cycle_min_mom: float = 0.8,
                 cycle_max_mom: float = 0.9, decay_mom_rate: float = 0.0, last_batch_iteration: int = -1):
        self.cycle = dict(first_step_size=cycle_first_step_size, second_step_size=cycle_second_step_size,
                          first_stair_count=cycle_first_stair_count, second_stair_count=cycle_second_stair_count,
                          decay_step_size=decay_step_size)
        self.min_lr, self.max_lr, self.decay_lr_rate = cycle_min_lr, cycle_max_lr, decay_lr_rate
        self.min_mom, self.max_mom, self.decay_mom_rate = cycle_min_mom, cycle_max_mom, decay_mom_rate
        self.cycle_momentum = cycle_momentum and "betas" in getattr(optimizer, "defaults", {})
        super().__init__(optimizer, last_batch_iteration)

    def values(self, t: int) -> list[float]:
        lr = formulas.one_cycle_lr(t, self.min_lr, self.max_lr, decay_lr_rate=self.decay_lr_rate, **self.cycle)
        return [lr] * len(self.optimizer.param_groups)

    def get_mom(self) -> float:
        return formulas.one_cycle_momentum(self.last_batch_iteration, self.min_mom, self.max_mom,
                                           decay_mom_rate=self.decay_mom_rate, **self.cycle)

    def _apply(self) -> None:
        super()._apply()
        if self.cycle_momentum:
            mom = self.get_mom()
            for group in self.optimizer.param_groups:
                group["betas"] = (mom, group["betas"][1])


SCHEDULERS = {cls.__name__: cls for cls in (WarmupLR, WarmupDecayLR, WarmupCosineLR, LRRangeTest, OneCycle)}

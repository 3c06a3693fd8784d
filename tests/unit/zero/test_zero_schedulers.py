"""Schedulers against DeepSpeed 0.19.8's formulas and reference traces (deepspeed/runtime/lr_schedules.py)."""
import math

import pytest
import torch

from launcher.zero.config.schema import NamedConfig
from launcher.zero.errors import ConfigError
from launcher.zero.sched import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR, build_scheduler
from launcher.zero.sched import formulas


def trace(scheduler, steps):
    values = [scheduler.optimizer.param_groups[0]["lr"]]
    for _ in range(steps):
        scheduler.step()
        values.append(scheduler.optimizer.param_groups[0]["lr"])
    return values


def optimizer(lr=0.1):
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def test_warmup_lr_log_trace():
    values = trace(WarmupLR(optimizer(), warmup_min_lr=0, warmup_max_lr=1e-3, warmup_num_steps=10), 12)
    expected = [0, 0] + [1e-3 * math.log(t + 1) / math.log(10) for t in range(1, 10)] + [1e-3, 1e-3]
    assert values == pytest.approx(expected, abs=1e-12)
    assert values[2] == pytest.approx(3.0103e-4, rel=1e-4) and values[3] == pytest.approx(4.7712e-4, rel=1e-4)


def test_warmup_lr_max_none_uses_group_lr():
    values = trace(WarmupLR(optimizer(lr=0.5), warmup_num_steps=4, warmup_type="linear"), 6)
    assert values == pytest.approx([0, 0, 0.125, 0.25, 0.375, 0.5, 0.5])


def test_warmup_decay_lr_trace():
    values = trace(WarmupDecayLR(optimizer(), total_num_steps=20, warmup_max_lr=1e-3, warmup_num_steps=5,
                                 warmup_type="linear"), 21)
    assert values[:7] == pytest.approx([0, 0, 2e-4, 4e-4, 6e-4, 8e-4, 1e-3])
    assert values[7] == pytest.approx(9.333e-4, rel=1e-3)
    assert values[-2] == pytest.approx(6.667e-5, rel=1e-3) and values[-1] == 0


def test_warmup_cosine_trace():
    values = trace(WarmupCosineLR(optimizer(0.1), total_num_steps=20, warmup_num_steps=5, warmup_type="linear"), 22)
    assert values[:6] == pytest.approx([0, 0, .02, .04, .06, .08])
    assert values[6] == pytest.approx(.098907, rel=1e-4) and values[7] == pytest.approx(.095678, rel=1e-4)
    assert values[19] == pytest.approx(.0011025, rel=1e-3)
    assert values[20] == pytest.approx(1e-5) and values[21] == pytest.approx(1e-5)  # clamped after T


def test_one_cycle_trace_and_decay():
    sched = OneCycle(optimizer(), cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=4,
                     decay_lr_rate=0.5, decay_step_size=2)
    values = trace(sched, 12)
    assert values[:9] == pytest.approx([1e-4, 3.25e-4, 5.5e-4, 7.75e-4, 1e-3, 7.75e-4, 5.5e-4, 3.25e-4, 1e-4])
    assert values[9:13] == pytest.approx([8e-5, 6.667e-5, 5.714e-5, 5e-5], rel=1e-3)


def test_one_cycle_momentum_keeps_beta2():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], betas=(0.9, 0.999))
    sched = OneCycle(opt, cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=4)
    assert opt.param_groups[0]["betas"] == (0.8, 0.999)  # min_mom at t = -1, as DeepSpeed
    sched.step()
    assert opt.param_groups[0]["betas"][0] == pytest.approx(0.9 - 0.1 * 0.25)


@pytest.mark.parametrize("staircase,expected", [
    (False, [1e-4, 1.6667e-4, 2.3333e-4, 3e-4, 3.6667e-4]),
    (True, [1e-4, 1e-4, 1e-4, 3e-4, 3e-4, 3e-4, 5e-4, 5e-4, 5e-4]),
])
def test_lr_range_test(staircase, expected):
    sched = LRRangeTest(optimizer(), lr_range_test_min_lr=1e-4, lr_range_test_step_size=3,
                        lr_range_test_step_rate=2, lr_range_test_staircase=staircase)
    assert trace(sched, len(expected) - 1) == pytest.approx(expected, rel=1e-4)


def test_state_dict_round_trip():
    first = WarmupLR(optimizer(), warmup_max_lr=1.0, warmup_num_steps=10)
    for _ in range(4):
        first.step()
    second = WarmupLR(optimizer(), warmup_max_lr=1.0, warmup_num_steps=10)
    second.load_state_dict(first.state_dict())
    assert second.get_last_lr() == first.get_last_lr() and second.last_batch_iteration == 3


def test_factory_names_and_errors():
    assert isinstance(build_scheduler(optimizer(), NamedConfig("WarmupLR", {})), WarmupLR)
    assert isinstance(build_scheduler(optimizer(), NamedConfig("StepLR", {"step_size": 2})), torch.optim.lr_scheduler.StepLR)
    with pytest.raises(ConfigError, match="unknown scheduler"):
        build_scheduler(optimizer(), NamedConfig("WarmupLr2", {}))
    with pytest.raises(ConfigError, match="scheduler.params"):
        build_scheduler(optimizer(), NamedConfig("WarmupDecayLR", {}))  # total_num_steps is required


def test_pure_formulas_edge_cases():
    assert formulas.warmup_lr(-1, 0.1, 1.0) == 0.1
    assert formulas.warmup_gamma(0, 1, "log") == 0.0 and formulas.warmup_gamma(5, 1, "log") == 1.0
    assert formulas.one_cycle_momentum(-1, 0.8, 0.9, 4) == 0.8
    assert formulas.one_cycle_momentum(20, 0.8, 0.9, 4, decay_mom_rate=0.5, decay_step_size=2) > 0.9

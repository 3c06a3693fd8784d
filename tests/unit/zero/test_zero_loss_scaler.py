"""The fp16 dynamic loss scaler against DeepSpeed 0.19.8's ZeRO rules (runtime/fp16/loss_scaler.py)."""
import pytest

from launcher.zero.config.schema import FP16Config
from launcher.zero.errors import LossScaleAtMinimumError
from launcher.zero.precision.loss_scaler import LossScaler, ScalerRules, initial_state, rules_from_config, update

PATTERN = [True, True, False, True, False, False, False, False, True, True, True]


def run(rules, overflows):
    state, scales = initial_state(rules), []
    for overflow in overflows:
        scales.append(state.scale)  # the scale the step was attempted with
        state = update(state, rules, overflow)
    return scales, state


@pytest.mark.parametrize("consecutive,expected", [
    (False, [65536, 32768, 32768, 16384, 16384, 16384, 16384, 32768, 32768, 16384, 8192]),
    (True, [65536, 32768, 32768, 32768, 32768, 32768, 32768, 65536, 65536, 32768, 16384]),
])
def test_reference_traces(consecutive, expected):
    rules = ScalerRules(initial_scale=65536, window=3, hysteresis=2, consecutive_hysteresis=consecutive)
    state = initial_state(rules)
    scales = []
    for overflow in PATTERN:
        state = update(state, rules, overflow)
        scales.append(state.scale)
    assert scales == expected  # the scale after each step


def test_minimum_raises():
    rules = ScalerRules(initial_scale=4, min_scale=1, hysteresis=1)
    state = initial_state(rules)
    state = update(state, rules, True)
    assert state.scale == 2
    state = update(state, rules, True)
    assert state.scale == 1
    with pytest.raises(LossScaleAtMinimumError, match="already at minimum"):
        update(state, rules, True)


def test_window_doubles_after_clean_steps():
    scales, state = run(ScalerRules(initial_scale=8, window=2, hysteresis=1), [False] * 5)
    assert scales == [8, 8, 8, 16, 16] and state.scale == 32


def test_static_scale_never_changes():
    rules = rules_from_config(FP16Config(enabled=True, loss_scale=128.0))
    scales, state = run(rules, [True, False, True, False])
    assert scales == [128.0] * 4 and state.scale == 128.0


def test_rules_from_config_defaults_and_round_trip():
    rules = rules_from_config(FP16Config(enabled=True))
    assert (rules.initial_scale, rules.window, rules.hysteresis, rules.min_scale) == (65536.0, 1000, 2, 1.0)
    scaler = LossScaler(rules)
    scaler.update(True)
    scaler.update(True)
    other = LossScaler(rules)
    other.load_state_dict(scaler.state_dict())
    assert other.state == scaler.state and other.scale == 32768.0


def test_stage0_uses_fp16_optimizer_rules():
    """Non-ZeRO fp16: no hysteresis, and the scale stays at the minimum instead of raising."""
    rules = rules_from_config(FP16Config(enabled=True, initial_scale_power=2, hysteresis=2, loss_scale_window=2),
                              zero_stage=0)
    scales, state = run(rules, [True, True, True, False, False, False])
    assert scales == [4, 2, 1, 1, 1, 1] and state.scale == 2
    zero_rules = rules_from_config(FP16Config(enabled=True, initial_scale_power=2, hysteresis=2), zero_stage=2)
    assert run(zero_rules, [True, True])[0] == [4, 4]  # the first overflow is absorbed

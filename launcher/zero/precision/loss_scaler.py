"""fp16 loss scaling as a pure state machine, with DeepSpeed 0.19.8's ZeRO rules
(runtime/fp16/loss_scaler.py, ``DynamicLossScaler.update_scale``).

``update(state, rules, overflow)`` is the whole algorithm; the engine keeps one state per run
and calls it once per optimizer step (accumulation boundary), overflowed or not.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from launcher.zero.errors import LossScaleAtMinimumError


@dataclass(frozen=True)
class ScalerRules:
    """The configured behaviour (fp16 section)."""

    initial_scale: float = 2.0 ** 16
    window: int = 1000                  # loss_scale_window
    min_scale: float = 1.0              # min_loss_scale
    hysteresis: int = 2                 # delayed_shift
    consecutive_hysteresis: bool = False
    dynamic: bool = True                # False: a static loss_scale, never changes
    factor: float = 2.0
    raise_error_at_min_scale: bool = True


@dataclass(frozen=True)
class ScalerState:
    """What changes from step to step."""

    scale: float
    iteration: int = 0                  # optimizer steps seen (cur_iter)
    last_overflow_iteration: int = -1
    hysteresis_left: int = 2            # cur_hysteresis


def initial_state(rules: ScalerRules) -> ScalerState:
    return ScalerState(scale=rules.initial_scale, hysteresis_left=rules.hysteresis)


def update(state: ScalerState, rules: ScalerRules, overflow: bool) -> ScalerState:
    """The state after one optimizer step that did (``overflow``) or did not overflow."""
    if not rules.dynamic:
        return replace(state, iteration=state.iteration + 1)
    scale, hysteresis_left, last_overflow = state.scale, state.hysteresis_left, state.last_overflow_iteration
    if overflow:
        if rules.hysteresis == 1 or hysteresis_left == 1:
            if scale == rules.min_scale and rules.raise_error_at_min_scale:
                raise LossScaleAtMinimumError(
                    "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.")
            scale = max(scale / rules.factor, rules.min_scale)
        else:
            hysteresis_left -= 1  # absorb this overflow, keep the scale
        last_overflow = state.iteration
    else:
        if rules.consecutive_hysteresis:
            hysteresis_left = rules.hysteresis
        stable = state.iteration - last_overflow - 1
        if stable > 0 and stable % rules.window == 0:
            if not rules.consecutive_hysteresis:
                hysteresis_left = rules.hysteresis
            scale *= rules.factor
    return ScalerState(scale=scale, iteration=state.iteration + 1, last_overflow_iteration=last_overflow,
                       hysteresis_left=hysteresis_left)


class LossScaler:
    """The engine's handle on the state machine (the only mutable part)."""

    def __init__(self, rules: ScalerRules):
        self.rules = rules
        self.state = initial_state(rules)

    @property
    def scale(self) -> float:
        return self.state.scale

    def update(self, overflow: bool) -> None:
        self.state = update(self.state, self.rules, overflow)

    def state_dict(self) -> dict:
        return {"rules": asdict(self.rules), "state": asdict(self.state)}

    def load_state_dict(self, data: dict) -> None:
        self.state = ScalerState(**data["state"])


def rules_from_config(fp16, zero_stage: int = 1) -> ScalerRules:
    """ScalerRules from an FP16Config (a static loss_scale > 0 disables the dynamics).

    Stage 0 follows DeepSpeed's non-ZeRO FP16_Optimizer (runtime/fp16/fused_optimizer.py): no hysteresis (every
    overflow halves the scale) and no error at the minimum scale; stages 1-3 the ZeRO rules.
    """
    if not fp16.dynamic:
        return ScalerRules(initial_scale=float(fp16.loss_scale), dynamic=False)
    zero = zero_stage > 0
    return ScalerRules(initial_scale=2.0 ** fp16.initial_scale_power, window=fp16.loss_scale_window,
                       min_scale=float(fp16.min_loss_scale), hysteresis=fp16.hysteresis if zero else 1,
                       consecutive_hysteresis=fp16.consecutive_hysteresis, raise_error_at_min_scale=zero)

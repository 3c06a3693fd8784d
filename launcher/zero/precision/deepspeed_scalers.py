"""DeepSpeed's loss scaler classes (``deepspeed.runtime.fp16.loss_scaler``), over this engine's rules.

Scripts import them to build a scaler of their own, to test what an optimizer holds, or to list
them in ``torch.serialization.add_safe_globals`` before loading a DeepSpeed checkpoint, whose
pickles hold these objects: so the attributes are DeepSpeed's names, and a pickled DeepSpeed
scaler loads into these classes. ``DynamicLossScaler.update_scale`` is the engine's own rule
(loss_scaler.update: DeepSpeed 0.19.8's ZeRO rule, hysteresis included).
"""
from __future__ import annotations

import logging

import torch

from launcher.zero.config.deepspeed_helpers import DeepSpeedConfigObject
from launcher.zero.precision.loss_scaler import ScalerRules, ScalerState, update

INITIAL_LOSS_SCALE = "init_scale"
SCALE_WINDOW = "scale_window"
DELAYED_SHIFT = "delayed_shift"
CONSECUTIVE_HYSTERESIS = "consecutive_hysteresis"
MIN_LOSS_SCALE = "min_scale"

_log = logging.getLogger("dslaunch.zero")   # the engine's logger (engine/log.py)


def to_python_float(t) -> float:
    """A one-element tensor (or sequence) as a float."""
    return t.item() if hasattr(t, "item") else t[0]


class LossScalerBase(DeepSpeedConfigObject):
    """A loss scale and the operations on it that do not depend on how it changes."""

    def __init__(self, cur_scale):
        super().__init__()
        self.cur_scale = cur_scale
        self.dynamic = False

    @property
    def loss_scale(self):
        return self.cur_scale

    def scale_gradient(self, module, grad_in, grad_out):
        return tuple(self.loss_scale * g for g in grad_in)

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            _log.warning("OVERFLOW! Skipping step. Gradients are non-finite, weights were not updated.")

    def scale_loss(self, loss):
        return loss * self.loss_scale

    def backward(self, loss, retain_graph: bool = False) -> None:
        self.scale_loss(loss).backward(retain_graph=retain_graph)


class LossScaler(LossScalerBase):
    """A static loss scale (``fp16.loss_scale`` > 0)."""

    def __init__(self, scale=1):
        super().__init__(scale)

    def has_overflow(self, params) -> bool:
        return False


class DynamicLossScaler(LossScalerBase):
    """DeepSpeed's dynamic scale: halve on overflow (after ``delayed_shift`` overflows), double
    after ``scale_window`` clean steps; an overflow at ``min_scale`` raises."""

    def __init__(self, init_scale, scale_window, min_scale, delayed_shift, consecutive_hysteresis,
                 raise_error_at_min_scale: bool = True, dtype=torch.half):
        super().__init__(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = 2.0
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale
        self.dynamic = True
        self.dtype = dtype

    def has_overflow_serial(self, params) -> bool:
        return any(p.grad is not None and not bool(torch.isfinite(p.grad).all()) for p in params)

    has_overflow = has_overflow_serial

    def update_scale(self, overflow: bool) -> None:
        """One optimizer step's outcome (the engine's rule, state read from and written to DeepSpeed's names)."""
        rules = ScalerRules(initial_scale=self.cur_scale, window=self.scale_window, min_scale=self.min_scale,
                            hysteresis=self.delayed_shift, consecutive_hysteresis=self.consecutive_hysteresis,
                            factor=self.scale_factor, raise_error_at_min_scale=self.raise_error_at_min_scale)
        state = update(ScalerState(scale=self.cur_scale, iteration=self.cur_iter,
                                   last_overflow_iteration=self.last_overflow_iter,
                                   hysteresis_left=self.cur_hysteresis), rules, overflow)
        if overflow:
            _log.info("OVERFLOW! Skipping step. Attempted loss scale: %s, now %s", self.cur_scale, state.scale)
        self.cur_scale, self.cur_iter = state.scale, state.iteration
        self.last_overflow_iter, self.cur_hysteresis = state.last_overflow_iteration, state.hysteresis_left


def CreateLossScaler(dtype, static_loss_scale, dynamic_scaling, dynamic_loss_args):  # noqa: N802 - DeepSpeed's name
    """fp16 with dynamic scaling: a DynamicLossScaler from ``dynamic_loss_args``; otherwise a
    static scaler (1.0 for bf16 and fp32, which are not scaled)."""
    if dtype == torch.half and dynamic_scaling:
        if dynamic_loss_args is None:
            raise ValueError("Dynamic loss scaling parameters must be defined.")
        return DynamicLossScaler(dtype=dtype, **dynamic_loss_args)
    return LossScaler(scale=static_loss_scale if dtype == torch.half else 1.0)

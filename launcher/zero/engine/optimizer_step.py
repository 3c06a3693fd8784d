"""The optimizer step of both engines, at an accumulation boundary, read top to bottom.

    update_parameters:  masters get their gradients -> the global norm -> skip (non-finite, the fp16
                        scale drops) or unscale and clip -> the optimizer -> masters into the model
    take_model_step:    update_parameters, then the scheduler and the step counters

What moves tensors is the strategy's (stages/base.py: ZeroStrategy's step methods; the pipeline
engine's stage is one too, pipeline/stage_strategy.py). What decides is here, once: the skip rule
(precision.policy.skips_non_finite), unscaling and clipping (stages/base.py ``clip_coefficient``,
``unscale_and_clip_factor``), which thread runs the optimizer (``step_optimizer``), the fp16 loss
scaler's update, and the counters. ``ZeroEngine.step`` and ``PipelineEngine.train_batch`` call
``take_model_step``; the optimizer ``initialize`` hands out calls ``update_parameters``.

Why the passes over the gradients come in this order (issue 39; scripts/step_census.py counts
them, tests/unit/zero/test_step_passes.py holds them). With 16-bit gradients, fp32 masters on the
device and torch's fused Adam/AdamW, the norm reads the 16-bit gradients as accumulated (2 bytes
an element on a GPU, whose norm kernel reads 16 bits into float32 sums; the CPU's casts first and
gives the very bits of the fp32 copy's norm, a GPU's may sum in another order, a last-bit
difference); the factor then exists, so the cast to fp32 divides by it as it writes
(``cast_master_grads``, 2 + 4 bytes) and the fused kernel steps without a ``grad_scale`` (28
bytes; with one it also writes the gradients back, 4 more). Casting first and handing the factor
to the kernel read the fp32 copy in the norm and wrote it back in the kernel: 50 bytes a
parameter against 44 (masters into the 16-bit weights and the buffer's zeroing included), the
same numbers either way. fp32 gradients need no cast: the kernel takes the factor
(optim/step_factor.py). Another optimizer gets the cast first and a separate multiply.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from launcher.zero.optim.step_factor import factor_in_kernel, fuses_grad_factor, grad_scale_of
from launcher.zero.precision.loss_scaler import LossScaler
from launcher.zero.stages.base import DeviceNorm, ZeroStrategy, unscale_and_clip_factor


@dataclass(frozen=True)
class StepRules:
    """What decides a step: whether an inf/NaN gradient skips it, the clip threshold (0: none), the
    device a fused optimizer's gradient factor is made on; ``sync_free`` False reads the norm on the
    host even where the step need not (a test's reference)."""

    skips_non_finite: bool
    clip: float
    device: torch.device
    sync_free: bool = True


@dataclass
class StepCounters:
    """DeepSpeed's counters, written only by ``take_model_step`` (and a checkpoint load)."""

    global_steps: int = 0
    global_samples: int = 0
    skipped_steps: int = 0


@dataclass(frozen=True)
class StepOutcome:
    """One update: whether it was applied, and the unscaled global norm (None after a skip; a
    DeviceNorm, still on the device, where nothing read it)."""

    applied: bool
    norm: float | DeviceNorm | None


def take_model_step(strategy: ZeroStrategy, optimizer: torch.optim.Optimizer, scaler: LossScaler | None,
                    scheduler, rules: StepRules, counters: StepCounters, samples: int,
                    lr_kwargs: dict | None = None, log: Callable[[str], None] | None = None) -> StepOutcome:
    """The update, then the scheduler (only after an applied update) and the counters; ``samples``
    is the step's train_batch_size."""
    outcome = update_parameters(strategy, optimizer, scaler, rules, counters.global_steps, log)
    if outcome.applied:
        if scheduler is not None:
            scheduler.step(**(lr_kwargs or {}))
    else:
        counters.skipped_steps += 1
    counters.global_steps += 1
    counters.global_samples += samples
    return outcome


def update_parameters(strategy: ZeroStrategy, optimizer: torch.optim.Optimizer, scaler: LossScaler | None,
                      rules: StepRules, step: int, log: Callable[[str], None] | None = None) -> StepOutcome:
    """DeepSpeed's ZeRO optimizer ``step()``. The gradients are dropped either way; ``step`` (the
    global step so far) names a skipped step in ``log``'s message."""
    strategy.wait_for_step()             # the previous step's background update (overlap_step)
    # masters get fp32 grads, averaged over ranks, times the loss scale; a 16-bit -> fp32 cast waits
    # for the factor where torch's fused Adam steps them (see the module docstring)
    strategy.prepare_master_grads(defer_cast=fuses_grad_factor(optimizer, strategy.masters_on_device))
    scale = float(scaler.scale) if scaler is not None else 1.0
    norm = global_norm(strategy, scale, on_device=norm_stays_on_device(strategy, rules))
    if rules.skips_non_finite and norm == float("inf"):
        _skip(scaler, scale, step, log)
        strategy.zero_grad()
        return StepOutcome(applied=False, norm=None)
    # unscale (1 / scale) and clip (1 / clip_coefficient) in one multiply, as DeepSpeed fuses them
    factor = unscale_and_clip_factor(norm, scale, rules.clip)
    step_optimizer(strategy, optimizer, factor, rules.device)
    if scaler is not None:
        scaler.update(False)
    return StepOutcome(applied=True, norm=norm)


def norm_stays_on_device(strategy: ZeroStrategy, rules: StepRules) -> bool:
    """Whether this step needs no host sync: nothing decides on the norm (no skip rule) and the
    optimizer takes its gradients on the device (an offloaded CPU Adam needs the factor as a number)."""
    return rules.sync_free and not rules.skips_non_finite and strategy.masters_on_device


def global_norm(strategy: ZeroStrategy, scale: float, on_device: bool) -> float | DeviceNorm:
    """The global gradient norm divided by the loss scale; inf when any gradient is not finite. A
    DeviceNorm (no host sync) where ``on_device`` (``norm_stays_on_device``)."""
    if on_device:
        total = strategy.grad_square_sum()
        if total is not None:            # None: a norm over two axes (tensor parallelism, pipelines)
            return DeviceNorm(total)
    stats = strategy.grad_norm_and_overflow()
    return float("inf") if stats.overflow else stats.norm / scale


def step_optimizer(strategy: ZeroStrategy, optimizer: torch.optim.Optimizer, factor: float | torch.Tensor,
                   device: torch.device) -> None:
    """Multiply the master grads by ``factor`` (unscale and clip), step the optimizer, bring the
    masters to the model, drop the grads. Which thread runs the optimizer is decided here:
    torch's fused Adam/AdamW (optim/step_factor.py says when) runs in this thread and applies the
    factor as its kernel reads each gradient; with ``offload_optimizer.overlap_step`` the
    strategy's overlap worker thread runs it and the rest; any other optimizer runs in this
    thread after a pass of its own over the grads."""
    if fuses_grad_factor(optimizer, strategy.masters_on_device):
        if strategy.cast_master_grads(grad_scale_of(factor, device)):
            optimizer.step()                      # this thread; the cast applied the factor
        else:
            with factor_in_kernel(optimizer, factor, device):
                optimizer.step()                  # this thread
    elif strategy.overlap is not None:
        strategy.scale_master_grads(factor)
        strategy.start_background_step(optimizer)  # the worker thread steps, writes the model, drops the grads
        return
    else:
        strategy.scale_master_grads(factor)
        optimizer.step()                          # this thread
    strategy.after_optimizer_step()   # masters -> model parameters (all-gathered when partitioned)
    strategy.zero_grad()


def _skip(scaler: LossScaler | None, scale: float, step: int, log: Callable[[str], None] | None) -> None:
    """A skipped step: the fp16 scale drops; ``log`` says so."""
    say = log or (lambda message: None)
    if scaler is not None:
        say(f"OVERFLOW! Skipping step {step + 1}. Attempted loss scale: {scale:g}")
        scaler.update(True)
        if scaler.rules.dynamic:
            say(f"Reducing loss scale to {scaler.scale:g}")
    else:
        say(f"non-finite gradients (inf/NaN) at step {step + 1}: step skipped")

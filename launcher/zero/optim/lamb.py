"""Lamb with DeepSpeed FusedLamb's trust ratio (deepspeed/ops/lamb/fused_lamb.py and its CUDA kernel), in plain torch.

The trust ratio uses the *uncorrected* moments; bias correction goes into the step size.
"""
from __future__ import annotations

import math

import torch


def lamb_coefficient(weight_norm: float, update_norm: float, min_coeff: float = 0.01,
                     max_coeff: float = 10.0) -> float:
    """The trust ratio ||w|| / ||u|| clamped to [min_coeff, max_coeff]; 1 when either norm is 0."""
    if weight_norm == 0 or update_norm == 0:
        return 1.0
    return min(max(weight_norm / update_norm, min_coeff), max_coeff)


class Lamb(torch.optim.Optimizer):
    """Layer-wise adaptive moments (one trust ratio per tensor the optimizer steps)."""

    def __init__(self, params, lr: float = 1e-3, bias_correction: bool = True, betas=(0.9, 0.999),
                 eps: float = 1e-8, eps_inside_sqrt: bool = False, weight_decay: float = 0.0,
                 max_grad_norm: float = 0.0, max_coeff: float = 10.0, min_coeff: float = 0.01):
        if max_grad_norm:
            raise ValueError("Lamb: max_grad_norm is not supported; use the gradient_clipping config key")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        eps_inside_sqrt=eps_inside_sqrt, weight_decay=weight_decay,
                        max_coeff=max_coeff, min_coeff=min_coeff)
        super().__init__(params, defaults)
        self.lamb_coeffs: list[float] = []

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self.lamb_coeffs = []
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad = param.grad.float()
                state = self.state[param]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                if group["eps_inside_sqrt"]:
                    denom = (exp_avg_sq + group["eps"]).sqrt()
                else:
                    denom = exp_avg_sq.sqrt().add_(group["eps"])
                update = exp_avg / denom
                if group["weight_decay"]:
                    update.add_(param.float(), alpha=group["weight_decay"])
                coeff = lamb_coefficient(float(param.float().norm()), float(update.norm()),
                                         group["min_coeff"], group["max_coeff"])
                step_size = group["lr"]
                if group["bias_correction"]:
                    t = state["step"]
                    step_size = step_size * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
                param.add_(update.to(param.dtype), alpha=-step_size * coeff)
                state["lamb_coeff"] = coeff
                self.lamb_coeffs.append(coeff)
        return loss

    def get_lamb_coeffs(self) -> list[float]:
        return list(self.lamb_coeffs)

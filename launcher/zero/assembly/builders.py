"""The client's optimizer and scheduler, for both engines: an object as given, a callable's result, or
one built from the config's section, each checked for its type."""
from __future__ import annotations

import torch

from launcher.zero.errors import ConfigError
from launcher.zero.optim import build_optimizer
from launcher.zero.optim.no_optimizer import no_optimizer
from launcher.zero.sched import build_scheduler


def client_optimizer(optimizer, params, cfg, process_group=None, offload: bool = False) -> torch.optim.Optimizer:
    """``optimizer`` (a torch optimizer, or a callable of the parameters), else the config's section
    over ``params`` (``process_group``, ``offload``: what 1-bit Adam and CPU Adam take), else, with
    neither, the placeholder of an engine for evaluation (DeepSpeed's DummyOptim, stages 0 and 3)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        built = optimizer(params)
        if not isinstance(built, torch.optim.Optimizer):
            raise ConfigError("optimizer: the callable did not return a torch.optim.Optimizer",
                              hint="optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)")
        return built
    if optimizer is not None:
        raise ConfigError(f"optimizer: expected an optimizer or a callable, got {type(optimizer).__name__}", hint=None)
    if cfg.optimizer is None:
        return no_optimizer(params, cfg.zero_stage)
    return build_optimizer(cfg.optimizer, params, process_group=process_group, offload=offload,
                           bf16_moments=bool(cfg.bf16.bf16_optimizer_states))


def client_scheduler(lr_scheduler, optimizer, cfg):
    """``lr_scheduler`` (a scheduler, or a callable of the optimizer), else the config's section; None
    without either."""
    if lr_scheduler is not None:
        if hasattr(lr_scheduler, "step"):
            return lr_scheduler
        if callable(lr_scheduler):
            return lr_scheduler(optimizer)
        raise ConfigError(f"lr_scheduler: expected a scheduler or a callable, got {type(lr_scheduler).__name__}", hint=None)
    if cfg.scheduler is not None:
        return build_scheduler(optimizer, cfg.scheduler)
    return None

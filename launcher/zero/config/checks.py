"""The checks `initialize` makes on a config that need no model, torch-free for `dslaunch --dry-run`.

`initialize` finds these mistakes by building the optimizer and scheduler; the launcher finds
them here before any rank starts: the optimizer's and scheduler's type and keyword arguments, and
whether ZeRO takes that optimizer. The tables are checked against the real constructors by
tests/unit/zero/test_config_checks.py, so they cannot drift from what `initialize` accepts.
"""
from __future__ import annotations

import difflib
import inspect

from launcher.zero.config.schema import NamedConfig, ZeroConfig
from launcher.zero.errors import ConfigError

# DeepSpeed's names, matched case-insensitively -> the keyword arguments the engine accepts
_ADAM_KEYS = frozenset({"lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
                        "differentiable", "fused",
                        "adam_w_mode", "torch_adam", "bias_correction", "set_grad_none"})
OPTIMIZER_KEYS: dict[str, frozenset | None] = {
    "adam": _ADAM_KEYS, "adamw": _ADAM_KEYS,
    "lamb": frozenset({"lr", "bias_correction", "betas", "eps", "eps_inside_sqrt", "weight_decay",
                       "max_grad_norm", "max_coeff", "min_coeff"}),
    "adagrad": None,   # torch's Adagrad: its arguments are checked when it is built
    "onebitadam": frozenset({"lr", "betas", "eps", "weight_decay", "freeze_step", "comm_backend_name",
                             "cuda_aware", "bias_correction", "amsgrad", "eps_inside_sqrt", "max_grad_norm"}),
    # DeepSpeed 0.19's Muon (optim/muon.py); other keys are refused, MUON_REFUSED says why for some
    "muon": frozenset({"lr", "muon_lr", "adam_lr", "momentum", "betas", "eps", "weight_decay", "ns_method",
                       "adam_w_mode"}),
}
NOT_AVAILABLE = ("lion", "onebitlamb", "zerooneadam")
# Muon keys with a reason of their own: DeepSpeed reads them, or silently ignores them
MUON_REFUSED = {
    "ns_steps": "DeepSpeed 0.19 ignores it (always 5 Newton-Schulz steps): remove ns_steps",
    "nesterov": "DeepSpeed 0.19 ignores it (Muon always uses Nesterov momentum): remove nesterov",
    "per_head_muon": "per-head orthogonalization is not built in this engine: remove per_head_muon",
    "torch_adam": "the auxiliary Adam is this engine's own: remove torch_adam",
    "fp32_optimizer_states": "Muon keeps fp32 state here: remove fp32_optimizer_states",
}
# torch.optim's classes, by their exact (case-sensitive) names, as the factory looks them up
TORCH_OPTIMIZERS = ("ASGD", "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "LBFGS", "Muon",
                    "NAdam", "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam")
TORCH_SCHEDULERS = ("ChainedScheduler", "ConstantLR", "CosineAnnealingLR", "CosineAnnealingWarmRestarts",
                    "CyclicLR", "ExponentialLR", "LambdaLR", "LinearLR", "MultiStepLR", "MultiplicativeLR",
                    "OneCycleLR", "PolynomialLR", "ReduceLROnPlateau", "SequentialLR", "StepLR")
ZERO_TESTED_OPTIMIZERS = ("Adam", "AdamW", "Adagrad", "OnebitAdam", "CPUAdam", "DeepSpeedCPUAdam", "MuonWithAdam")
# the class each DeepSpeed name builds (what check_zero_support sees)
_BUILT_CLASS = {"adam": "AdamW", "adamw": "AdamW", "lamb": "Lamb", "adagrad": "Adagrad", "onebitadam": "OnebitAdam",
                "muon": "MuonWithAdam"}


def check_without_model(config: ZeroConfig) -> None:
    """Raise the ConfigError `initialize` would raise for the config's optimizer and scheduler."""
    if config.optimizer is not None:
        _check_optimizer(config.optimizer, config.zero_stage, config.zero_allow_untested_optimizer)
        _check_muon(config)
    if config.scheduler is not None:
        _check_scheduler(config.scheduler)


def check_optimizer_section(config: ZeroConfig) -> None:
    """The config's optimizer section alone (``initialize`` checks it before the rendezvous)."""
    _check_optimizer(config.optimizer, config.zero_stage, config.zero_allow_untested_optimizer)
    _check_muon(config)


def _check_muon(config: ZeroConfig) -> None:
    """What this engine's Muon does not build yet, refused by name (DeepSpeed 0.19 runs some of it)."""
    if config.optimizer is None or config.optimizer.type.lower() != "muon":
        return
    fix = 'or use "AdamW"'
    if config.zero_stage == 3 and config.zero_optimization.reduce_scatter:
        # DeepSpeed 0.19 raises "Muon and reduce scatter cannot be used together" at stage 3
        raise ConfigError("optimizer Muon at ZeRO stage 3 needs zero_optimization.reduce_scatter false "
                          "(DeepSpeed 0.19 refuses it too)", hint=f'set "reduce_scatter": false {fix}')
    if config.zero_optimization.offload_optimizer_active:
        raise ConfigError("optimizer Muon: zero_optimization.offload_optimizer is not built in this engine",
                          hint=f"remove offload_optimizer {fix}")
    if config.fp16.enabled or config.bf16.enabled:
        raise ConfigError("optimizer Muon: only fp32 training is built in this engine",
                          hint=f"disable fp16 / bf16 {fix}")


def check_scheduler_section(config: ZeroConfig) -> None:
    """The config's scheduler section alone."""
    _check_scheduler(config.scheduler)


def _check_optimizer(spec: NamedConfig, stage: int, allow_untested: bool) -> None:
    name = spec.type.lower()
    if name in NOT_AVAILABLE:
        raise ConfigError(f"optimizer.type: '{spec.type}' is not available in this engine",
                          hint="use Adam, AdamW, Lamb, OneBitAdam or a torch.optim class name")
    if name not in OPTIMIZER_KEYS and spec.type not in TORCH_OPTIMIZERS:
        raise ConfigError(f"optimizer.type: unknown optimizer '{spec.type}'",
                          hint=_close(spec.type, ["Adam", "AdamW", "Lamb", "OneBitAdam", *TORCH_OPTIMIZERS])
                          or "use Adam, AdamW, Lamb, OneBitAdam or a torch.optim class name (case-sensitive)")
    accepted = OPTIMIZER_KEYS.get(name)
    if name == "muon":
        for key in spec.params:
            if key in MUON_REFUSED:
                raise ConfigError(f"optimizer.params: Muon: '{key}' is not taken", hint=MUON_REFUSED[key])
        if spec.params.get("ns_method", "gram") not in ("gram", "standard"):
            raise ConfigError(f"optimizer.params.ns_method: {spec.params['ns_method']!r} is not a Newton-Schulz "
                              "method", hint="use 'gram' (the default) or 'standard'")
    if accepted is not None:
        _check_keys(spec, accepted, "optimizer")
    if name == "onebitadam" and stage != 0:
        raise ConfigError(f"optimizer {spec.type} does its own gradient communication and needs "
                          f"zero_optimization.stage 0 (got {stage})", hint="set zero_optimization.stage to 0")
    built = _BUILT_CLASS.get(name, spec.type)
    if stage != 0 and not allow_untested and built not in ZERO_TESTED_OPTIMIZERS:
        raise ConfigError(f"optimizer {built} is not tested with ZeRO stage {stage}",
                          hint='set "zero_allow_untested_optimizer": true to use it anyway')


def _check_scheduler(spec: NamedConfig) -> None:
    from launcher.zero.sched.schedulers import SCHEDULERS   # torch-free: pure formulas

    cls = SCHEDULERS.get(spec.type)
    if cls is None:
        if spec.type in TORCH_SCHEDULERS:
            return
        hint = _close(spec.type, [*SCHEDULERS, *TORCH_SCHEDULERS])
        known = sorted(SCHEDULERS) + ["any torch.optim.lr_scheduler class"]
        raise ConfigError(f"scheduler.type: unknown scheduler '{spec.type}'",
                          hint=hint or f"use one of {', '.join(known)}")
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "optimizer"}
    _check_keys(spec, frozenset(accepted), "scheduler")


def _check_keys(spec: NamedConfig, accepted: frozenset, section: str) -> None:
    for key in spec.params:
        if key not in accepted:
            hint = _close(key, sorted(accepted), prefix=f"{section}.params.")
            raise ConfigError(f"{section}.params: {spec.type} takes no argument '{key}'",
                              hint=hint or f"{spec.type} takes: {', '.join(sorted(accepted))}")


def _close(word: str, choices: list[str], prefix: str = "") -> str | None:
    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not found:
        lowered = {c.lower(): c for c in choices}   # 'adamW' -> 'AdamW'
        found = [lowered[word.lower()]] if word.lower() in lowered else []
    return f"did you mean '{prefix}{found[0]}'?" if found else None

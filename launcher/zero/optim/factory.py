"""Build the optimizer named in the config over the model's param groups."""
from __future__ import annotations

import importlib

import torch

from launcher.zero.config.checks import ZERO_TESTED_OPTIMIZERS  # one list for dry-run and initialize
from launcher.zero.errors import ConfigError

# DeepSpeed's keys that torch's constructors do not take
_ADAM_ONLY_KEYS = ("adam_w_mode", "torch_adam", "bias_correction", "fused", "set_grad_none")
# DeepSpeed FusedAdam's (and DeepSpeedCPUAdam's) constructor defaults; torch's AdamW would
# otherwise put weight_decay=0.01 on a config that names none
_FUSED_ADAM_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}


def build_optimizer(spec, params, process_group=None, offload: bool = False,
                    bf16_moments: bool = False) -> torch.optim.Optimizer:
    """An optimizer from a NamedConfig(type, params) over ``params`` (tensors or param-group dicts).

    With ``offload`` (ZeRO-Offload), Adam and AdamW run as our multi-threaded CPU Adam, as
    DeepSpeed builds DeepSpeedCPUAdam, unless ``torch_adam: true`` asks for torch's; it keeps bf16
    masters' moments in bf16 with ``bf16_moments`` (``bf16.bf16_optimizer_states``), else as
    ``fp32_optimizer_states`` says (fp32 by default). Without offload, ``bf16_moments`` (bf16
    masters and moments on the device) takes torch's fused kernel on any device: it reads bf16 in
    fp32 and rounds each result once, where the other kernels compute in bf16.
    """
    name = spec.type.lower()
    kwargs = dict(spec.params)
    if "betas" in kwargs:
        kwargs["betas"] = tuple(kwargs["betas"])
    if name in ("adam", "adamw") and not kwargs.get("torch_adam", False):
        for key, value in _FUSED_ADAM_DEFAULTS.items():   # "torch_adam": true keeps torch's own
            kwargs.setdefault(key, value)
    try:
        if name in ("adam", "adamw") and offload and not kwargs.get("torch_adam", False):
            return _cpu_adam(params, name, kwargs, bf16_moments)
        if name in ("adam", "adamw"):
            return _device_adam(params, name, kwargs, bf16_moments)
        if name == "lamb":
            from launcher.zero.optim.lamb import Lamb

            return Lamb(params, **kwargs)
        if name == "adagrad":
            return torch.optim.Adagrad(params, **kwargs)
        if name in ("onebitadam",):
            module = importlib.import_module("launcher.zero.optim.onebit")
            return module.OnebitAdam(params, process_group=process_group, **kwargs)
        if name == "muon":
            from launcher.zero.optim.muon import MuonWithAdam, muon_param_groups

            adam_w_mode = kwargs.pop("adam_w_mode", True)
            return MuonWithAdam(muon_param_groups(params, kwargs), adam_w_mode=adam_w_mode)
        if name in ("lion", "onebitlamb", "zerooneadam"):
            raise ConfigError(f"optimizer.type: '{spec.type}' is not available in this engine",
                              hint="use Adam, AdamW, Lamb, OneBitAdam or a torch.optim class name")
        cls = getattr(torch.optim, spec.type, None)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise ConfigError(f"optimizer.type: unknown optimizer '{spec.type}'",
                              hint="use Adam, AdamW, Lamb, OneBitAdam or a torch.optim class name (case-sensitive)")
        return cls(params, **kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"optimizer.params: {spec.type}: {error}",
                          hint=f"check the constructor arguments of {spec.type}") from None


def _device_adam(params, name: str, kwargs: dict, bf16_moments: bool) -> torch.optim.Optimizer:
    """torch's Adam or AdamW where the parameters are (DeepSpeed's FusedAdam's place)."""
    adam_w_mode = kwargs.pop("adam_w_mode", True)
    if kwargs.pop("bias_correction", True) is not True:
        raise ConfigError("optimizer.params.bias_correction: only true is supported", hint="remove bias_correction")
    fused = kwargs.pop("fused", None)
    for key in _ADAM_ONLY_KEYS:
        kwargs.pop(key, None)
    params = materialize_params(params)
    # one fused kernel over all tensors on the GPU (the foreach path makes several passes)
    if fused is None:
        fused = all_on_cuda(params) or bf16_moments
    # DeepSpeed: "Adam" means decoupled weight decay unless adam_w_mode is false
    cls = torch.optim.AdamW if (name == "adamw" or adam_w_mode) else torch.optim.Adam
    return cls(params, fused=bool(fused) or None, **kwargs)


def _cpu_adam(params, name: str, kwargs: dict, bf16_moments: bool) -> torch.optim.Optimizer:
    """Offload's Adam/AdamW: our CPU Adam with DeepSpeedCPUAdam's keys (``fp32_optimizer_states``)."""
    from launcher.zero.optim.cpu_adam import CPUAdam

    adamw_mode = name == "adamw" or kwargs.pop("adam_w_mode", True)
    bias_correction = kwargs.pop("bias_correction", True)
    fp32_moments = not bf16_moments and bool(kwargs.pop("fp32_optimizer_states", True))
    for key in _ADAM_ONLY_KEYS:
        kwargs.pop(key, None)
    return CPUAdam(params, adamw_mode=adamw_mode, bias_correction=bias_correction,
                   fp32_optimizer_states=fp32_moments, **kwargs)


def materialize_params(params) -> list:
    """Params as a list (of tensors, or of group dicts with list 'params'): safe to read twice."""
    items = [params] if torch.is_tensor(params) else list(params)
    result = []
    for item in items:
        if isinstance(item, dict):
            inner = item["params"]
            item = {**item, "params": [inner] if torch.is_tensor(inner) else list(inner)}
        result.append(item)
    return result


def all_on_cuda(params: list) -> bool:
    tensors = [t for item in params for t in (item["params"] if isinstance(item, dict) else [item])]
    return bool(tensors) and all(torch.is_tensor(t) and t.is_cuda for t in tensors)


def check_zero_support(optimizer: torch.optim.Optimizer, stage: int, allow_untested: bool) -> None:
    """DeepSpeed's rule: ZeRO stages >= 1 accept only tested optimizers unless allowed."""
    if stage == 0 or allow_untested:
        return
    name = type(optimizer).__name__
    if name not in ZERO_TESTED_OPTIMIZERS:
        raise ConfigError(f"optimizer {name} is not tested with ZeRO stage {stage}",
                          hint='set "zero_allow_untested_optimizer": true to use it anyway')


def check_master_dtype_support(optimizer: torch.optim.Optimizer, bf16_section, offload: bool) -> None:
    """DeepSpeed 0.19.8's rule for offloaded bf16 masters (runtime/base_optimizer.py): the CPU Adam
    steps them, and with ``bf16_optimizer_states`` it keeps their moments in bf16."""
    if not (offload and bf16_section.bf16_master_weights_and_grads):
        return
    from launcher.zero.optim.cpu_adam import CPUAdam

    if not isinstance(optimizer, CPUAdam):
        raise ConfigError("bf16.bf16_master_weights_and_grads with offload_optimizer needs the engine's CPU Adam, "
                          f"the optimizer is {type(optimizer).__name__}",
                          hint='use "optimizer": {"type": "AdamW"} (or Adam) in the config, or pass '
                               "deepspeed.ops.adam.DeepSpeedCPUAdam")
    if bf16_section.bf16_optimizer_states and optimizer.fp32_optimizer_states:
        raise ConfigError("bf16.bf16_optimizer_states with offload_optimizer needs the CPU Adam to keep bf16 "
                          "moments: it was built with fp32_optimizer_states=True",
                          hint="build it with DeepSpeedCPUAdam(..., fp32_optimizer_states=False), or let the "
                               "config's optimizer section build it")

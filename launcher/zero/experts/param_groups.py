"""Telling expert parameters from the rest, and the optimizer param groups DeepSpeed scripts build.

An expert parameter carries ``allreduce = False`` and ``group_name = 'ep_size_<N>'`` (set by the
MoE layer). Optimizers get them in their own param groups, marked ``'moe': True`` and named by
``group_name``, because their gradients are reduced over a different group of ranks (and ZeRO
partitions them over it).
"""
from __future__ import annotations

from torch import nn

from launcher.zero.errors import ConfigError
from launcher.zero.experts.layer import MoE

MAX_GROUP_SIZE = 178956971   # DeepSpeed's default: elements per MoE param group before it is split


def is_moe_param(param) -> bool:
    """Whether ``param`` belongs to an expert (reduced over its expert-data group only)."""
    return hasattr(param, "allreduce") and not param.allreduce


def has_moe_layers(model: nn.Module) -> tuple[bool, int]:
    """``(True, num_experts of the first MoE layer)`` if ``model`` has an MoE layer, else ``(False, 0)``."""
    for module in model.modules():
        if isinstance(module, MoE):
            return True, module.num_experts
    return False, 0


def split_params_into_shared_and_expert_params(params) -> tuple[list, list]:
    """``(shared, expert)`` parameters, each in the order given."""
    shared = [p for p in params if not is_moe_param(p)]
    return shared, [p for p in params if is_moe_param(p)]


def split_params_grads_into_shared_and_expert_params(params) -> tuple[list, list]:
    """The gradients (cast to their parameter's dtype) of ``(shared, expert)`` parameters that have one."""
    shared, expert = [], []
    for param in params:
        if param.grad is not None:
            (expert if is_moe_param(param) else shared).append(param.grad.to(param.dtype))
    return shared, expert


def is_moe_param_group(param_group: dict) -> bool:
    return param_group.get("moe", False)


def split_params_into_different_moe_groups_for_optimizer(param_groups, max_group_size=MAX_GROUP_SIZE) -> list:
    """Move expert parameters out of ``param_groups`` into groups of their own, one per (original
    group, expert group name), each a copy of the original's options with ``'name': 'ep_size_<N>'``
    and ``'moe': True``, split so none holds more than ``max_group_size`` elements (None: unsplit).

    Like DeepSpeed's: the given group dicts lose their expert parameters and a given list is
    extended in place; the list is also returned. Every group needs a ``'name'``.
    """
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ConfigError(f"split_params_into_different_moe_groups_for_optimizer: param groups of type "
                          f"{type(param_groups).__name__}", hint="pass a param group dict, or a list or tuple of them")
    for index, group in enumerate(param_groups):
        group["params"] = list(group["params"])   # a generator would be used up by the first pass
        if "name" not in group:
            raise ConfigError(f"split_params_into_different_moe_groups_for_optimizer: param group {index} has "
                              "no 'name'", hint="give every param group a 'name', e.g. {'params': ..., 'name': 'dense'}")
    # Expert group names in the order first met (DeepSpeed iterates a set, whose order varies by run).
    names = list(dict.fromkeys(p.group_name for group in param_groups for p in group["params"] if is_moe_param(p)))
    moe_groups = []
    for group in list(param_groups):
        params = group["params"]
        group["params"] = [p for p in params if not is_moe_param(p)]
        for name in names:
            expert = [p for p in params if is_moe_param(p) and p.group_name == name]
            template = {**group, "name": name, "moe": True}
            moe_groups += [{**template, "params": chunk} for chunk in _chunks(expert, max_group_size)]
    param_groups.extend(moe_groups)
    return param_groups


def _chunks(params: list, max_size) -> list[list]:
    """``params`` in order, cut so no chunk's elements exceed ``max_size`` (a bigger param stands alone)."""
    if max_size is None:
        return [params]
    chunks, current, size = [], [], 0
    for param in params:
        numel = param.ds_numel if hasattr(param, "ds_numel") else param.numel()
        if current and size + numel > max_size:
            chunks.append(current)
            current, size = [], 0
        current.append(param)
        size += numel
    return chunks + ([current] if current else [])


def configure_moe_param_groups(model_parameters: list) -> list:
    """The engine's step for MoE models: parameters (or groups without MoE groups yet) -> split groups.

    A list of parameters becomes one group named ``dense-params`` before the split."""
    if not isinstance(model_parameters, list):
        raise ConfigError(f"MoE param groups: model_parameters is a {type(model_parameters).__name__}",
                          hint="pass a list of parameters or of param group dicts")
    for item in model_parameters:
        if not isinstance(item, (nn.Parameter, dict)) and not hasattr(item, "shape"):
            raise ConfigError(f"MoE param groups: an entry of model_parameters is a {type(item).__name__}",
                              hint="entries are tensors or param group dicts")
    if not model_parameters:
        return model_parameters
    if isinstance(model_parameters[0], dict):
        if any("moe" in group for group in model_parameters):
            return model_parameters
        return split_params_into_different_moe_groups_for_optimizer(model_parameters)
    return split_params_into_different_moe_groups_for_optimizer({"params": model_parameters, "name": "dense-params"})

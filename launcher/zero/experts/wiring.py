"""MoE models in the engine: the expert groups built at ``zero.initialize`` and what the stages ask.

``set_up_experts`` finds the MoE layers, builds one ``ExpertTopology`` per distinct ``ep_size``
over the data-parallel ranks, creates the groups and hands each layer its expert group. The
result, ``ExpertSetup``, tells the stages which ranks an optimizer param group is reduced and
partitioned over: dense groups over the data-parallel ranks, a ``moe: True`` group named
``ep_size_<N>`` over that size's expert-data group (its ranks hold the same experts).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from launcher.zero.distributed.context import DistContext
from launcher.zero.errors import ConfigError, NotSupportedError
from launcher.zero.experts import registry
from launcher.zero.experts.groups import ExpertGroups, new_expert_groups
from launcher.zero.experts.layer import MoE
from launcher.zero.experts.param_groups import is_moe_param
from launcher.zero.experts.group_ranks import expert_topology


@dataclass
class ExpertSetup:
    """This rank's expert groups (by name) and the contexts the stages use for expert param groups."""

    groups: dict[str, ExpertGroups] = field(default_factory=dict)
    contexts: dict[str, DistContext] = field(default_factory=dict)   # name -> over the expert-data group
    layers: list = field(default_factory=list)                        # (module name, MoE layer)
    rank: int = 0                                                      # this rank's global rank

    def __bool__(self) -> bool:
        return bool(self.layers)


class _DataAxis:
    """The data-parallel ranks as a one-axis topology (what ``expert_topology`` reads)."""

    def __init__(self, ranks: list[int]):
        self.ranks = ranks

    def world_size(self) -> int:
        return len(self.ranks)

    def get_dim(self, axis: str) -> int:
        return len(self.ranks) if axis == "data" else 1

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        return [list(self.ranks)] if axis == "data" else []


def moe_layers(module: torch.nn.Module) -> list[tuple[str, MoE]]:
    return [(name, child) for name, child in module.named_modules() if isinstance(child, MoE)]


def data_ranks(dist_context: DistContext) -> list[int]:
    """The global ranks of the data-parallel group, in group order."""
    if dist_context.group is None:
        return list(range(dist_context.world_size))
    return list(dist.get_process_group_ranks(dist_context.group))


def set_up_experts(module: torch.nn.Module, dist_context: DistContext, config=None, tensor_size: int = 1,
                   new_group=None) -> ExpertSetup:
    """Build the expert groups of every ``ep_size`` in ``module`` and hand them to its MoE layers;
    ``config`` (a ZeroConfig) and the layout's ``tensor_size`` are checked for what MoE is not built with.

    Collective when the model has MoE layers (every rank creates every group); a no-op without."""
    layers = moe_layers(module)
    setup = ExpertSetup(layers=layers)
    if not layers:
        return setup
    if config is not None:
        check_engine_support(setup, config.zero_stage, bool(config.zero_optimization.offload_optimizer_active),
                             tensor_size > 1)
    ranks = data_ranks(dist_context)
    me = setup.rank = ranks[dist_context.rank]
    for ep_size in sorted({layer.ep_size for _, layer in layers}):
        topology = expert_topology(_DataAxis(ranks), ep_size)
        groups = new_expert_groups(topology, me, new_group)
        setup.groups[groups.name] = groups
        setup.contexts[groups.name] = _context_over(groups.expert_data_group, groups.expert_data_ranks, me,
                                                    dist_context)
    for _, layer in layers:
        if layer.ep_size > 1:
            layer.set_ep_group(setup.groups[layer.expert_group_name].expert_group)
    registry.record(dist_context, setup.groups)
    return setup


def _context_over(group, ranks: tuple[int, ...], me: int, data: DistContext) -> DistContext:
    return DistContext(group=group, rank=ranks.index(me), world_size=len(ranks), local_rank=data.local_rank,
                       device=data.device, backend=data.backend, local_world_size=data.local_world_size)


# ---- the checks zero.initialize makes --------------------------------------------------------

def refuse_in_pipeline(module: torch.nn.Module) -> None:
    if moe_layers(module):
        raise NotSupportedError("MoE layers in a PipelineModule are not supported by dslaunch's engine yet",
                                hint="train MoE models with zero.initialize on a plain module (data and expert "
                                     "parallelism)")


def check_engine_support(setup: ExpertSetup, stage: int, offload: bool, pipeline_or_tensor: bool = False) -> None:
    """What this engine does not build with MoE layers: a NotSupportedError naming it."""
    if not setup:
        return
    if stage == 3:
        raise NotSupportedError("MoE layers with ZeRO stage 3 are not supported by dslaunch's engine (DeepSpeed "
                                "0.19.8 refuses its native MoE at stage 3 too)",
                                hint="use zero_optimization.stage 0, 1 or 2 with MoE models")
    if offload:
        raise NotSupportedError("MoE layers with zero_optimization.offload_optimizer are not supported by "
                                "dslaunch's engine yet", hint="remove offload_optimizer, or use stage 0-2 on the device")
    if pipeline_or_tensor:
        raise NotSupportedError("MoE layers with tensor parallelism (mpu=) are not supported by dslaunch's engine yet",
                                hint="train MoE models with data and expert parallelism only")


def check_param_groups(setup: ExpertSetup, param_groups: list[dict]) -> None:
    """Every expert parameter in a ``moe: True`` group named after its expert group, and nothing
    else in those groups (ZeRO partitions such a group over the expert-data ranks only)."""
    if not setup:
        return
    moe_groups = [g for g in param_groups if g.get("moe", False)]
    if not moe_groups:
        raise ConfigError("the model has MoE layers but no optimizer param group is marked 'moe': True",
                          hint="build the optimizer over launcher.zero.moe.utils."
                               "split_params_into_different_moe_groups_for_optimizer({'params': "
                               "model.parameters(), 'name': 'parameters'}) (DeepSpeed refuses this too)")
    for index, group in enumerate(param_groups):
        name = group.get("name")
        for param in group["params"]:
            if not param.requires_grad:
                continue
            if group.get("moe", False) and (not is_moe_param(param) or param.group_name != name):
                raise ConfigError(f"optimizer param group {index} ({name!r}) is marked 'moe' but holds a parameter "
                                  f"of {getattr(param, 'group_name', 'the dense model')!r}",
                                  hint="split the groups with split_params_into_different_moe_groups_for_optimizer")
            if not group.get("moe", False) and is_moe_param(param):
                raise ConfigError(f"optimizer param group {index} ({name!r}) holds an expert parameter of "
                                  f"{param.group_name!r} but is not marked 'moe'",
                                  hint="split the groups with split_params_into_different_moe_groups_for_optimizer")
        if group.get("moe", False) and name not in setup.contexts:
            raise ConfigError(f"optimizer param group {index} is marked 'moe' with name {name!r}, which is no "
                              f"expert group of this model ({sorted(setup.contexts)})",
                              hint="let split_params_into_different_moe_groups_for_optimizer name the groups")


# ---- what the stages ask ---------------------------------------------------------------------

def broadcast_from_first(module: torch.nn.Module, dist_context: DistContext, contexts: dict[str, DistContext]) -> None:
    """Every rank starts from the first rank's weights: dense tensors over the data-parallel ranks,
    expert parameters over their expert-data ranks (the ranks holding the same experts)."""
    tensors = list(dict.fromkeys(list(module.parameters()) + list(module.buffers())))
    with torch.no_grad():
        for tensor in tensors:
            context = contexts.get(getattr(tensor, "group_name", None)) if is_moe_param(tensor) else dist_context
            if context is None or context.world_size == 1:
                continue
            group = context.group
            source = 0 if group is None else dist.get_global_rank(group, 0)
            dist.broadcast(tensor.data, src=source, group=group)


def counted_once_square_sum(parts, sharded: bool, dist_context: DistContext) -> torch.Tensor:
    """The sum of squares of every parameter's gradient counted once over the data-parallel ranks.

    ``parts`` is ``(square sum on this rank, ranks holding the same values)`` per master tensor;
    each is divided by its copies and the whole summed over the data-parallel group. Sharded
    masters hold distinct values on every rank (1 copy)."""
    total = None
    for square, copies in parts:
        value = square if sharded or copies == 1 else square / copies
        total = value if total is None else total + value
    if total is None:
        total = torch.zeros((), dtype=torch.float64, device=dist_context.device)
    if dist_context.world_size > 1:
        total = total.to(dist_context.device)
        dist.all_reduce(total, group=dist_context.group)
    return total


_EXPERT_KEY = re.compile(r"(^|\.)deepspeed_moe\.experts\.deepspeed_experts\.(\d+)\.")


def _expert_of(name: str, setup: ExpertSetup):
    """``(layer, local index, match)`` when ``name`` is an expert parameter of a layer with ep > 1."""
    match = _EXPERT_KEY.search(name)
    if match is None:
        return None
    prefix = name[:match.start()].rstrip(".") if match.group(1) else ""
    for layer_name, layer in setup.layers:
        if layer_name == prefix and layer.ep_size > 1:
            return layer, int(match.group(2)), match
    return None


def global_expert_name(name: str, setup: ExpertSetup | None) -> str:
    """A parameter name with its local expert index replaced by the global expert id, so that every
    expert has one name in checkpoints whatever rank holds it (``...deepspeed_experts.<global>.``)."""
    found = _expert_of(name, setup) if setup else None
    if found is None:
        return name
    layer, local, match = found
    expert_rank = setup.groups[layer.expert_group_name].expert_ranks.index(setup.rank)
    return f"{name[:match.start(2)]}{expert_rank * layer.num_local_experts + local}{name[match.end(2):]}"


def every_expert_entry(entry: dict, setup: ExpertSetup | None) -> list[dict]:
    """A checkpoint's parameter entry (``name``, ``shape``...) written by a rank holding the first
    experts -> the entries of the same parameter of every global expert of its layer."""
    found = _expert_of(entry["name"], setup) if setup else None
    if found is None:
        return [entry]
    layer, local, match = found
    name = entry["name"]
    return [{**entry, "name": f"{name[:match.start(2)]}{block * layer.num_local_experts + local}{name[match.end(2):]}"}
            for block in range(layer.ep_size)]

"""The groups of the last ``zero.initialize``, for the ``deepspeed.utils.groups`` getters scripts call.

The engine passes groups to the layers and strategies directly; this record exists only because
DeepSpeed scripts ask a module of globals (``groups._get_expert_parallel_group('ep_size_2')``).
``zero.initialize`` writes it once per engine; nothing inside the engine reads it.
"""
from __future__ import annotations

import torch.distributed as dist

from launcher.zero.errors import ConfigError

_RECORD: dict = {"data": None, "experts": {}}


def record(data_context, expert_groups: dict) -> None:
    """Remember the data-parallel context and every ``ExpertGroups`` (by name) of an engine."""
    _RECORD["data"] = data_context
    _RECORD["experts"] = dict(expert_groups)


def _experts(group_name: str):
    found = _RECORD["experts"].get(group_name)
    if found is None:
        known = sorted(_RECORD["experts"]) or "none: no zero.initialize with an MoE model yet"
        raise ConfigError(f"groups: no expert groups named {group_name!r} (known: {known})",
                          hint="names are 'ep_size_<N>' for the ep_size of a model's MoE layers; "
                               "call zero.initialize with the model first")
    return found


def _data():
    if _RECORD["data"] is None and not (dist.is_available() and dist.is_initialized()):
        raise ConfigError("groups: torch.distributed is not initialized",
                          hint="call zero.initialize (or deepspeed.init_distributed) first")
    return _RECORD["data"]


def _get_expert_parallel_group(group_name: str):
    return _experts(group_name).expert_group


def _get_expert_data_parallel_group(group_name: str):
    return _experts(group_name).expert_data_group


def _get_expert_parallel_group_ranks(group_name: str) -> list[int]:
    return list(_experts(group_name).expert_ranks)


def _get_expert_data_parallel_group_ranks(group_name: str) -> list[int]:
    return list(_experts(group_name).expert_data_ranks)


def _get_expert_parallel_group_dict() -> dict:
    return {name: groups.expert_group for name, groups in _RECORD["experts"].items()}


def _get_expert_data_parallel_group_dict() -> dict:
    return {name: groups.expert_data_group for name, groups in _RECORD["experts"].items()}


def _get_expert_parallel_world_size(group_name: str) -> int:
    return len(_experts(group_name).expert_ranks)


def _get_expert_data_parallel_world_size(group_name: str) -> int:
    return len(_experts(group_name).expert_data_ranks)


def _get_expert_parallel_rank(group_name: str) -> int:
    return _experts(group_name).expert_ranks.index(dist.get_rank())


def _get_expert_data_parallel_rank(group_name: str) -> int:
    return _experts(group_name).expert_data_ranks.index(dist.get_rank())


def _get_expert_parallel_src_rank(group_name: str) -> int:
    return _experts(group_name).expert_ranks[0]


def _get_expert_broadcast_src_rank(group_name: str) -> int:
    return _experts(group_name).expert_data_ranks[0]


def _get_max_expert_size() -> int:
    """The largest ``ep_size`` of the engine's MoE layers (1 without any)."""
    return max((groups.ep_size for groups in _RECORD["experts"].values()), default=1)


def _get_max_expert_size_name() -> str:
    return f"ep_size_{_get_max_expert_size()}"


def _get_max_expert_parallel_group():
    return _get_expert_parallel_group(_get_max_expert_size_name())


def _get_data_parallel_group():
    context = _data()
    group = context.group if context is not None else None
    return group if group is not None else dist.group.WORLD


def _get_data_parallel_world_size() -> int:
    context = _data()
    return context.world_size if context is not None else dist.get_world_size()


def _get_data_parallel_rank() -> int:
    context = _data()
    return context.rank if context is not None else dist.get_rank()


def _get_data_parallel_group_ranks() -> list[int]:
    context = _data()
    if context is None or context.group is None:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(context.group)


def _get_broadcast_src_rank() -> int:
    return _get_data_parallel_group_ranks()[0]


def _get_model_parallel_world_size() -> int:
    return 1

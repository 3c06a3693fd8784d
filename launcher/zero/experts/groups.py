"""The process groups of an ``ExpertTopology``, created on every rank (``new_group`` is collective).

Every rank creates every group in the same order and keeps the two it belongs to; the engine
hands ``expert_group`` to the MoE layers of that ``ep_size`` and reduces their parameters'
gradients over ``expert_data_group``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from launcher.zero.experts.group_ranks import ExpertTopology


@dataclass
class ExpertGroups:
    """This rank's groups for one ``ep_size`` (named ``ep_size_<N>``, as DeepSpeed names them)."""

    name: str
    ep_size: int
    expert_group: object            # the ranks exchanging tokens (all-to-all)
    expert_ranks: tuple[int, ...]
    expert_data_group: object       # the ranks holding the same experts (gradient reduction)
    expert_data_ranks: tuple[int, ...]


def new_expert_groups(topology: ExpertTopology, rank: int, new_group=None) -> ExpertGroups:
    """Create every group of ``topology`` (collective: all ranks call it alike); return ``rank``'s.

    ``new_group`` defaults to ``torch.distributed.new_group``."""
    new_group = new_group or dist.new_group
    mine = {}
    for kind, lists in (("expert", topology.expert_groups), ("expert_data", topology.expert_data_groups)):
        for ranks in lists:
            group = new_group(ranks=list(ranks))
            if rank in ranks:
                mine[kind] = (ranks, group)
    return ExpertGroups(name=topology.name, ep_size=topology.ep_size,
                        expert_group=mine["expert"][1], expert_ranks=mine["expert"][0],
                        expert_data_group=mine["expert_data"][1], expert_data_ranks=mine["expert_data"][0])

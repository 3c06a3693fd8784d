"""Mixture of Experts: the layer, its gating, expert parallelism and the optimizer param groups.

The internal home of what scripts reach as ``deepspeed.moe`` (``layer.MoE``, ``utils.*``)."""
from launcher.zero.experts.groups import ExpertGroups, new_expert_groups
from launcher.zero.experts.layer import MoE, MOELayer, TopKGate
from launcher.zero.experts.param_groups import (has_moe_layers, is_moe_param, is_moe_param_group,
                                                split_params_into_different_moe_groups_for_optimizer)
from launcher.zero.experts.group_ranks import ExpertTopology, expert_topology

__all__ = ["ExpertGroups", "ExpertTopology", "MOELayer", "MoE", "TopKGate", "expert_topology", "has_moe_layers",
           "is_moe_param", "is_moe_param_group", "new_expert_groups",
           "split_params_into_different_moe_groups_for_optimizer"]

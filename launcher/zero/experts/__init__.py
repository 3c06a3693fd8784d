"""Mixture of Experts: the layer, its gating, expert parallelism and the optimizer param groups.

The internal home of what scripts reach as ``deepspeed.moe`` (``layer.MoE``, ``utils.*``)."""
from launcher.zero.experts.groups import ExpertGroups, new_expert_groups
from launcher.zero.experts.layer import MoE, MOELayer, TopKGate
from launcher.zero.experts.topology import ExpertTopology, expert_topology

__all__ = ["ExpertGroups", "ExpertTopology", "MOELayer", "MoE", "TopKGate", "expert_topology", "new_expert_groups"]

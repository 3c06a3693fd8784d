"""Mixture of Experts: the layer, its gating, expert parallelism and the optimizer param groups.

The internal home of what scripts reach as ``deepspeed.moe`` (``layer.MoE``, ``utils.*``)."""
from launcher.zero.experts.topology import ExpertTopology, expert_topology

__all__ = ["ExpertTopology", "expert_topology"]

"""The Mixture-of-Experts layer with DeepSpeed 0.19.8's API: ``MoE(hidden_size, expert, ...)``.

``MoE.forward(x)`` returns ``(output, l_aux, exp_counts)``. Inside: the gate (``TopKGate``) routes
each token to ``k`` experts; ``MOELayer`` copies tokens into per-expert buffers, exchanges them
over the expert group when the experts are spread over ranks (``ep_size > 1``), runs the experts
and puts the weighted results back in token order.

Module and attribute names are DeepSpeed's (``deepspeed_moe.gate.wg``,
``deepspeed_moe.experts.deepspeed_experts.N``, ``mlp``, ``coefficient``), so state dicts and
checkpoints use the keys DeepSpeed users know, and modules are built in DeepSpeed's order so the
same seed gives the same initial weights. The expert group is handed in (``ep_group=`` or
``set_ep_group``), never looked up in a global.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from launcher.zero.errors import ConfigError
from launcher.zero.experts import gating
from launcher.zero.experts.dispatch import AllToAll, flat_slots, from_experts, to_experts
from launcher.zero.experts.experts import Experts
from launcher.zero.experts.group_ranks import check_experts_divide, expert_group_name

NOISY_GATE_POLICIES = (None, "None", "Jitter", "RSample")


@dataclass(frozen=True)
class GatePolicy:
    """How a gate routes: the MoE layer's gating arguments, checked when the layer is built."""

    k: int = 1                        # experts per token: 1 (Switch), 2 (GShard) or more
    capacity_factor: float = 1.0      # training: each expert holds capacity_factor * k * S / E routes
    eval_capacity_factor: float = 1.0  # the same in eval mode
    min_capacity: int = 4             # an expert holds at least this many routes
    noisy_gate_policy: str | None = None  # 'Jitter' (input noise) or 'RSample' (top-1 Gumbel), in training
    drop_tokens: bool = True          # False: capacity grows to the busiest expert, no route is dropped
    use_rts: bool = True              # top-1: a full expert keeps a random set of its tokens
    top2_2nd_expert_sampling: bool = True  # top-2: the second expert is Gumbel-sampled

    def check(self, num_experts: int) -> None:
        if not isinstance(self.k, int) or isinstance(self.k, bool) or not 1 <= self.k <= num_experts:
            raise ConfigError(f"MoE: k {self.k!r} must be an integer from 1 to num_experts ({num_experts})",
                              hint="k is how many experts each token is sent to")
        if self.noisy_gate_policy not in NOISY_GATE_POLICIES:
            raise ConfigError(f"MoE: noisy_gate_policy {self.noisy_gate_policy!r} is not one of "
                              f"{list(NOISY_GATE_POLICIES)}", hint="use None, 'Jitter' or 'RSample'")
        if not isinstance(self.min_capacity, int) or self.min_capacity < 0:
            raise ConfigError(f"MoE: min_capacity {self.min_capacity!r} is not an integer >= 0", hint=None)
        for key in ("capacity_factor", "eval_capacity_factor"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"MoE: {key} {getattr(self, key)!r} must be > 0", hint=None)
        if self.noisy_gate_policy == "RSample" and self.k != 1:
            # DeepSpeed applies RSample to top-1 only; keep its results, but say so.
            warnings.warn(f"MoE: noisy_gate_policy 'RSample' only changes top-1 gating; with k={self.k} it "
                          "has no effect (as in DeepSpeed)", stacklevel=4)


class TopKGate(nn.Module):
    """The router: a bias-free linear map to one logit per expert, then top-1/top-2/top-k gating."""

    def __init__(self, model_dim: int, num_experts: int, policy: GatePolicy, ep_group=None):
        super().__init__()
        self.wg = nn.Linear(model_dim, num_experts, bias=False)
        self.policy = policy
        self.k = policy.k
        self.ep_group = ep_group

    def forward(self, tokens: Tensor, used_token: Tensor | None = None) -> gating.Routing:
        policy = self.policy
        inputs = tokens.float()
        if policy.noisy_gate_policy == "Jitter" and self.training:
            inputs = gating.jitter(inputs)
        logits = F.linear(inputs, weight=self.wg.weight.float(), bias=None)
        capacity_factor = policy.capacity_factor if self.training else policy.eval_capacity_factor
        if self.k == 1:
            noise = policy.noisy_gate_policy if self.training else None
            return gating.top1(logits, capacity_factor, policy.min_capacity, used_token, noise,
                               policy.drop_tokens, policy.use_rts, self.ep_group)
        if used_token is not None:
            warnings.warn(f"MoE: used_token only masks top-1 gating; with k={self.k} every token is routed "
                          "(as in DeepSpeed)", stacklevel=3)
        if self.k == 2:
            return gating.top2(logits, capacity_factor, policy.min_capacity, policy.drop_tokens, self.ep_group,
                               policy.top2_2nd_expert_sampling)
        return gating.topk(logits, self.k, capacity_factor, policy.min_capacity, policy.drop_tokens, self.ep_group)


class MOELayer(nn.Module):
    """Gate, dispatch, (exchange,) experts, (exchange back,) combine. Keeps the last ``l_aux`` and
    ``exp_counts`` as attributes, as DeepSpeed's does."""

    def __init__(self, gate: TopKGate, experts: Experts, ep_group_name: str, ep_size: int, num_local_experts: int):
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.ep_group = None
        self.ep_group_name = ep_group_name
        self.ep_size = ep_size
        self.num_local_experts = num_local_experts
        self.l_aux = None
        self.exp_counts = None

    def set_ep_group(self, group) -> None:
        self.ep_group = group
        self.gate.ep_group = group

    def forward(self, hidden_states: Tensor, used_token: Tensor | None = None) -> Tensor:
        model_dim = hidden_states.shape[-1]
        tokens = hidden_states.reshape(-1, model_dim)
        routing = self.gate(tokens, used_token)
        self.l_aux, self.exp_counts = routing.l_aux, routing.exp_counts
        slots = flat_slots(routing)
        buffer = to_experts(tokens, slots, routing.num_experts, routing.capacity)
        if self.ep_size > 1:
            buffer = AllToAll.apply(self._group(), buffer)
        # [ranks of the expert group, local experts, capacity, model]: every sender's tokens per expert
        output = self.experts(buffer.reshape(self.ep_size, self.num_local_experts, -1, model_dim))
        output = output.reshape(self.ep_size * self.num_local_experts, -1, model_dim)
        if self.ep_size > 1:
            output = AllToAll.apply(self._group(), output)
        return from_experts(output, slots, routing.weights).reshape(hidden_states.shape)

    def _group(self):
        if self.ep_group is None:
            raise ConfigError(f"MoE layer with ep_size {self.ep_size} has no expert group",
                              hint="pass ep_group= to MoE (a process group of ep_size ranks), call "
                                   "moe.set_ep_group(group), or train the model through the engine")
        return self.ep_group


class MoE(nn.Module):
    """A Mixture-of-Experts layer (DeepSpeed's ``deepspeed.moe.layer.MoE``).

    ``num_experts`` copies of ``expert`` (``num_experts / ep_size`` on each rank of an expert group);
    ``use_residual`` adds the dense ``expert`` beside them, mixed by a learned 2-way softmax (PR-MoE).
    ``ep_group`` is the process group of the ``ep_size`` ranks that share this layer's experts.
    """

    def __init__(self, hidden_size: int, expert: nn.Module, num_experts: int = 1, ep_size: int = 1, k: int = 1,
                 capacity_factor: float = 1.0, eval_capacity_factor: float = 1.0, min_capacity: int = 4,
                 use_residual: bool = False, noisy_gate_policy: str | None = None, drop_tokens: bool = True,
                 use_rts: bool = True, use_tutel: bool = False, enable_expert_tensor_parallelism: bool = False,
                 top2_2nd_expert_sampling: bool = True, *, ep_group=None):
        super().__init__()
        check_experts_divide(num_experts, ep_size)
        policy = GatePolicy(k, capacity_factor, eval_capacity_factor, min_capacity, noisy_gate_policy,
                            drop_tokens, use_rts, top2_2nd_expert_sampling)
        policy.check(num_experts)
        if use_tutel:
            warnings.warn("MoE: use_tutel is a speed option of DeepSpeed's (Tutel kernels); dslaunch routes "
                          "without it, with the same results", stacklevel=2)
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = enable_expert_tensor_parallelism
        self.ep_size = ep_size
        self.expert_group_name = expert_group_name(ep_size)
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        # Built in DeepSpeed's order (experts are copies; then the gate's weight; then the
        # coefficient), so one seed draws the same initial weights.
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        self.deepspeed_moe = MOELayer(TopKGate(hidden_size, num_experts, policy), experts,
                                      self.expert_group_name, ep_size, self.num_local_experts)
        if use_residual:
            self.mlp = expert
            self.coefficient = nn.Linear(hidden_size, 2)
        if ep_group is not None:
            self.set_ep_group(ep_group)

    def set_ep_group(self, group) -> None:
        """Use ``group`` (``ep_size`` ranks) for this layer's token exchange and no-drop capacity."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) != self.ep_size:
            raise ConfigError(f"MoE: the expert group has {dist.get_world_size(group)} ranks but ep_size is "
                              f"{self.ep_size}", hint="build the group from expert_topology(topology, ep_size)")
        self.deepspeed_moe.set_ep_group(group)

    def forward(self, hidden_states: Tensor, used_token: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(output, l_aux, exp_counts)``: output has ``hidden_states``' shape; ``l_aux`` is the
        load-balancing loss to add (scaled) to the training loss; ``exp_counts`` the routes per expert."""
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            dense = self.mlp(hidden_states)
            if isinstance(dense, tuple):
                dense = dense[0]
            mix = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * mix[..., 0:1] + dense * mix[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts

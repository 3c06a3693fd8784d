"""Gating: for every token, which experts it goes to, its slot in their buffers and its weight.

The top-1 (Switch), top-2 and top-k (GShard) gates of DeepSpeed 0.19.8, decision for decision and
draw for draw: the same logits and the same torch seed choose the same experts, drop the same
tokens and give the same ``l_aux`` and ``exp_counts``. Everything here runs in fp32.

Glossary: a *route* is one (token, expert) pair, ``k`` per token; an expert's *capacity* is how
many routes its buffer holds; a *slot* is a route's row in that buffer; a route that finds its
expert's buffer full is *dropped* (expert ``-1``, weight 0), so the token gets nothing from it.

The random draws, in order (all from torch's default generator on the logits' device):
top-1 ``RSample``: Gumbel noise on the logits, then (``use_rts``) one uniform per (token, expert)
to pick which tokens keep a full expert's slots; top-2: Gumbel noise on the logits for the second
choice (``top2_2nd_expert_sampling``); top-k: none. ``Jitter`` (in the layer) draws before all.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from launcher.zero.errors import ConfigError


@dataclass
class Routing:
    """A gate's decision for ``S`` tokens and its by-products. Routes are rows of ``[k, S]`` tensors."""

    experts: Tensor      # [k, S] int64: the expert of each route, -1 where the route was dropped
    slots: Tensor        # [k, S] int64: the route's row in its expert's buffer (0 where dropped)
    weights: Tensor      # [k, S] fp32: the weight of the expert's output in the token's output
    capacity: int        # rows in each expert's buffer
    num_experts: int
    l_aux: Tensor        # the load-balancing loss (a scalar)
    exp_counts: Tensor   # [E] how many routes chose each expert, before any was dropped


# ---- the random draws ------------------------------------------------------------------------

def jitter(x: Tensor, epsilon: float = 1e-2) -> Tensor:
    """``x`` times a uniform factor in ``[1 - epsilon, 1 + epsilon)`` per element (Switch's jitter)."""
    if epsilon == 0:
        return x
    low = torch.tensor(1.0 - epsilon, device=x.device)
    high = torch.tensor(1.0 + epsilon, device=x.device)
    return x * (low + torch.rand(x.shape, device=x.device) * (high - low))


def gumbel(shape, device) -> Tensor:
    """Standard Gumbel noise, ``-log(-log(u))`` with ``u`` uniform in ``[tiny, 1 - eps)`` (fp32)."""
    finfo = torch.finfo(torch.float32)
    low = torch.tensor(finfo.tiny, device=device)
    high = torch.tensor(1 - finfo.eps, device=device)
    uniform = low + torch.rand(shape, device=device) * (high - low)
    return -torch.log(-torch.log(uniform))


# ---- capacity ---------------------------------------------------------------------------------

def capacity_for(num_tokens: int, num_experts: int, capacity_factor: float, min_capacity: int) -> int:
    """``ceil(S / E * capacity_factor)``, at least ``min_capacity``; the product is rounded in fp32."""
    capacity = torch.ceil((num_tokens / num_experts) * torch.tensor(capacity_factor)).to(torch.int64)
    return max(int(capacity), int(min_capacity))


def largest_count(exp_counts: Tensor, ep_group) -> int:
    """The busiest expert's count over the expert group: the capacity that drops no token.

    Every rank of an expert group must size its buffers alike for the all-to-all, so they agree on
    the maximum (a collective on ``ep_group`` when it has more than one rank)."""
    largest = torch.max(exp_counts).detach().clone()
    if ep_group is not None and dist.get_world_size(ep_group) > 1:
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=ep_group)
    return int(largest)


def _load_balance(gates: Tensor, chosen: Tensor) -> Tensor:
    """Mean gate probability times the fraction of tokens routed, per expert (not yet reduced)."""
    return torch.mean(gates, dim=0) * torch.mean(chosen.float(), dim=0)


# ---- the gates --------------------------------------------------------------------------------

def top1(logits: Tensor, capacity_factor: float, min_capacity: int, used_token: Tensor | None = None,
         noise: str | None = None, drop_tokens: bool = True, use_rts: bool = True, ep_group=None) -> Routing:
    """Switch gating: each token to its most likely expert (``noise='RSample'``: the Gumbel-noised one).

    A full expert keeps ``capacity`` of its tokens: with ``use_rts`` a random set, else the first
    ones (in the order ``torch.topk`` breaks ties). ``used_token`` (0/1 per token) masks tokens out.
    """
    noisy = logits + gumbel(logits.shape, logits.device) if noise == "RSample" else None
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    capacity = capacity_for(num_tokens, num_experts, capacity_factor, min_capacity)
    chosen = torch.argmax(noisy if noisy is not None else gates, dim=1)
    mask = F.one_hot(chosen, num_classes=num_experts)
    if used_token is not None:
        mask = used_token.unsqueeze(1) * mask
    exp_counts = torch.sum(mask, dim=0).detach()
    if not drop_tokens:
        # DeepSpeed also caps this at the local token count: a no-op (no expert gets more tokens
        # than there are) unless ranks hold different counts, where it would break the exchange.
        capacity = largest_count(exp_counts, ep_group)
    l_aux = torch.sum(_load_balance(gates, mask)) * num_experts

    # Random token selection: a full expert keeps the tokens with the largest uniform draw.
    priority = mask * torch.rand(mask.shape, device=logits.device) if use_rts else mask
    if num_tokens < min_capacity:
        raise ConfigError(f"MoE top-1 gate: {num_tokens} tokens is fewer than min_capacity {min_capacity}",
                          hint="pass min_capacity=0 to the MoE layer, or feed it more tokens per batch")
    keep = torch.topk(priority, k=min(capacity, num_tokens), dim=0).indices
    mask = mask * torch.zeros_like(mask).scatter_(0, keep, 1)

    kept = mask.sum(dim=1) > 0
    slots = (torch.cumsum(mask, dim=0) - 1).gather(1, chosen.unsqueeze(1)).squeeze(1).long()
    weights = gates.gather(1, chosen.unsqueeze(1)).squeeze(1) * kept
    return Routing(experts=torch.where(kept, chosen, -1).unsqueeze(0), slots=(slots * kept).unsqueeze(0),
                   weights=weights.unsqueeze(0), capacity=capacity, num_experts=num_experts, l_aux=l_aux,
                   exp_counts=exp_counts)


def top2(logits: Tensor, capacity_factor: float, min_capacity: int, drop_tokens: bool = True, ep_group=None,
         sample_second: bool = True) -> Routing:
    """GShard top-2: the most likely expert, then (``sample_second``) a Gumbel-sampled other one.

    Capacity is ``capacity_factor * 2`` per token; first choices take slots before second ones, in
    token order, and routes past capacity are dropped. The two weights are renormalised to sum to 1.
    """
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    first = torch.argmax(gates, dim=1)
    mask1 = F.one_hot(first, num_classes=num_experts)
    if sample_second:
        logits = logits + gumbel(logits.shape, logits.device)
    second = torch.argmax(logits.masked_fill(mask1.bool(), float("-inf")), dim=1)
    mask2 = F.one_hot(second, num_classes=num_experts)

    rows1 = torch.cumsum(mask1, dim=0) - 1
    rows2 = torch.cumsum(mask2, dim=0) - 1 + torch.sum(mask1, dim=0, keepdim=True)
    l_aux = torch.mean(_load_balance(gates, mask1)) * num_experts * num_experts
    exp_counts = torch.sum(mask1 + mask2, dim=0).detach()
    if drop_tokens:
        capacity = capacity_for(num_tokens, num_experts, capacity_factor * 2, min_capacity)
        mask1 = mask1 * torch.lt(rows1, capacity)
        mask2 = mask2 * torch.lt(rows2, capacity)
    else:
        capacity = largest_count(exp_counts, ep_group)

    kept1, kept2 = mask1.sum(dim=1) > 0, mask2.sum(dim=1) > 0
    weight1 = gates.gather(1, first.unsqueeze(1)).squeeze(1) * kept1
    weight2 = gates.gather(1, second.unsqueeze(1)).squeeze(1) * kept2
    total = torch.clamp(weight1 + weight2, min=torch.finfo(torch.float32).eps)
    slot1 = rows1.gather(1, first.unsqueeze(1)).squeeze(1) * kept1
    slot2 = rows2.gather(1, second.unsqueeze(1)).squeeze(1) * kept2
    return Routing(experts=torch.stack([torch.where(kept1, first, -1), torch.where(kept2, second, -1)]),
                   slots=torch.stack([slot1, slot2]).long(), weights=torch.stack([weight1 / total, weight2 / total]),
                   capacity=capacity, num_experts=num_experts, l_aux=l_aux, exp_counts=exp_counts)


def topk(logits: Tensor, k: int, capacity_factor: float, min_capacity: int, drop_tokens: bool = True,
         ep_group=None) -> Routing:
    """Top-k (k > 2): the k most likely experts, no noise. A full expert keeps its ``capacity`` most
    confident routes; slots follow token order; kept weights are renormalised to sum to 1."""
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    top_gates, top_experts = torch.topk(gates, k=k, dim=1)
    mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_experts, True)
    exp_counts = torch.sum(mask, dim=0).detach()
    l_aux = torch.mean(_load_balance(gates, mask)) * num_experts * num_experts / k
    if drop_tokens:
        capacity = capacity_for(num_tokens, num_experts, capacity_factor * k, min_capacity)
        confidence = torch.zeros_like(gates).scatter(1, top_experts, top_gates)
        keep = torch.topk(confidence, k=min(capacity, num_tokens), dim=0, sorted=False).indices
        mask = mask & torch.zeros_like(mask).scatter_(0, keep, True)
    else:
        capacity = largest_count(exp_counts, ep_group)
    rows = torch.cumsum(mask, dim=0) - 1

    masked = gates * mask
    masked = masked / torch.clamp(torch.sum(masked, dim=-1, keepdim=True), min=torch.finfo(masked.dtype).eps)
    kept = mask.gather(1, top_experts)
    return Routing(experts=torch.where(kept, top_experts, -1).t().contiguous(),
                   slots=(rows.gather(1, top_experts) * kept).t().contiguous(),
                   weights=masked.gather(1, top_experts).t().contiguous(),
                   capacity=capacity, num_experts=num_experts, l_aux=l_aux, exp_counts=exp_counts)

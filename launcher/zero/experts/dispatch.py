"""Moving tokens into the experts' buffers and the experts' results back, by index, and the exchange.

The buffers are one ``[E, C, M]`` tensor (expert, capacity slot, model dim). A token is copied to
each of its kept routes' slots; slots no route fills stay zero. Copies are gathers (``index_select``)
so their cost is ``S * k * M``, not the ``S * E * C * M`` of the one-hot einsum of the GShard paper.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from launcher.zero.experts.gating import Routing


def flat_slots(routing: Routing) -> Tensor:
    """``[k, S]`` rows of the flattened ``[E * C]`` buffer; dropped routes point one past the end."""
    flat = routing.experts * routing.capacity + routing.slots
    return torch.where(routing.experts >= 0, flat, routing.num_experts * routing.capacity)


def to_experts(tokens: Tensor, slots: Tensor, num_experts: int, capacity: int) -> Tensor:
    """``[S, M]`` tokens -> the ``[E, C, M]`` buffer their routes fill (zeros where none does)."""
    num_tokens, model_dim = tokens.shape
    buffer_rows = num_experts * capacity
    # The source token of each buffer row; rows no route fills read a zero row appended to the
    # tokens. Dropped routes all write to one extra row, which is cut off.
    source = torch.full((buffer_rows + 1,), num_tokens, dtype=torch.long, device=tokens.device)
    source.scatter_(0, slots.reshape(-1), torch.arange(num_tokens, device=tokens.device).repeat(slots.shape[0]))
    padded = torch.cat([tokens, tokens.new_zeros(1, model_dim)])
    return padded.index_select(0, source[:buffer_rows]).view(num_experts, capacity, model_dim)


def from_experts(expert_output: Tensor, slots: Tensor, weights: Tensor) -> Tensor:
    """The ``[E, C, M]`` results -> ``[S, M]``: each token's routes weighted and summed.

    The weights are fp32, so the sum over routes is taken in fp32 and cast to the experts' dtype
    once (summing bf16/fp16 products loses precision)."""
    model_dim = expert_output.shape[-1]
    rows = expert_output.reshape(-1, model_dim)
    padded = torch.cat([rows, rows.new_zeros(1, model_dim)])   # dropped routes read this zero row
    routed = padded.index_select(0, slots.reshape(-1)).view(*slots.shape, model_dim)
    return (routed * weights.unsqueeze(-1)).sum(dim=0).to(expert_output.dtype)


class AllToAll(torch.autograd.Function):
    """Row block ``i`` of the input goes to rank ``i`` of ``group``; block ``i`` of the output came
    from rank ``i``. The gradient takes the same exchange back."""

    @staticmethod
    def forward(ctx, group, buffer: Tensor) -> Tensor:
        ctx.group = group
        return exchange(buffer, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return None, exchange(grad, ctx.group)


def exchange(buffer: Tensor, group) -> Tensor:
    """One ``all_to_all_single`` over ``group`` (gloo and NCCL both have it), equal blocks along dim 0."""
    buffer = buffer.contiguous()
    received = torch.empty_like(buffer)
    dist.all_to_all_single(received, buffer, group=group)
    return received

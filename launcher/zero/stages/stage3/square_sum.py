"""Stage 3's global gradient norm, as a square-sum tensor on the device (no host sync).

Each group's flat gradient (``strategy.step_grads()``) is measured once (stages/base.py ``square_sum``); a persistent parameter (whole on every
rank) is counted on rank 0 alone. With offload and one contribution per shard, the partitioned
squares were already summed on the device as the shards were copied out (stage3/strategy.py).
An inf or NaN anywhere makes the sum non-finite, which is the overflow flag.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from launcher.zero.stages.base import square_sum as tensor_square_sum


def square_sum(strategy) -> torch.Tensor:
    """The sum of squares of ``strategy``'s master grads over all ranks (0-dim float64)."""
    ctx = strategy.context
    if strategy.offload_optimizer and not strategy.device_grads and strategy._norm_on_device \
            and ctx.dist_context.device.type == "cuda":
        return _from_device(strategy)
    grads = strategy.step_grads()
    present = [g for g in grads if g is not None]
    device = present[0].device if present else ctx.dist_context.device
    total = torch.zeros((), dtype=torch.float64, device=device)
    for grad, slots in zip(grads, strategy.group_slots):
        if grad is None or grad.numel() == 0:
            continue
        grad = grad.detach()
        total = total + tensor_square_sum(grad)
        if ctx.dist_context.rank != 0:   # rank 0 alone accounts for the parameters every rank holds whole
            total = total - pieces_square_sum([grad[s.offset:s.offset + s.length] for s in slots if s.persistent],
                                              total.device)
    if ctx.dist_context.world_size > 1:
        total = total.to(ctx.dist_context.device)
        dist.all_reduce(total, group=ctx.parallel.group("data"))
    return total


def _from_device(strategy) -> torch.Tensor:
    """The partitioned squares summed on the device during backward, plus (rank 0) the persistent ones."""
    ctx = strategy.context
    total = torch.as_tensor(strategy._device_squares, dtype=torch.float64, device=ctx.dist_context.device).reshape(())
    positions = list(zip(strategy.masters, strategy.group_slots, strategy.on_device))
    for master, slots, _ in (p for p in positions if p[2] and p[0].grad is not None):
        # offload_optimizer.ratio: these shards were added up in a device buffer, never copied out
        total = total + tensor_square_sum(master.grad.detach())
        if ctx.dist_context.rank != 0:
            total = total - pieces_square_sum([master.grad[s.offset:s.offset + s.length] for s in slots
                                               if s.persistent], total.device)
    if ctx.dist_context.rank == 0:
        pieces = [master.grad[slot.offset:slot.offset + slot.length]
                  for master, slots, on_device in positions if master.grad is not None and not on_device
                  for slot in slots if slot.persistent]
        total = total + pieces_square_sum(pieces, total.device).to(ctx.dist_context.device)
    if ctx.dist_context.world_size > 1:
        dist.all_reduce(total, group=ctx.parallel.group("data"))
    return total


def pieces_square_sum(pieces: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The float64 sum of squares of ``pieces`` (a float32 norm each, in one foreach call; these are
    the small persistent parameters, so 16-bit pieces are cast first)."""
    if not pieces:
        return torch.zeros((), dtype=torch.float64, device=device)
    if pieces[0].element_size() < 4:   # 16-bit grads (a deferred cast): norms in float32, as of fp32 grads
        pieces = [piece.float() for piece in pieces]
    return torch.stack(torch._foreach_norm(pieces)).double().square().sum()

"""What the gradient reductions of stages 0 and 1 share: whole gradients in one buffer per group.

A reduction policy decides how gradients accumulate and reach the range each rank's master
covers. It is bound to its strategy (``bind``) and uses the strategy's groups, bucket plan,
bucket queue and pending-collective list. Stage 2's policy keeps no whole gradients and lives
in stage2.py alone.
"""
from __future__ import annotations

import torch

from launcher.zero.layout.flat import GradBuffer


class WholeGradients:
    """Gradients accumulate whole on every rank (each ``param.grad`` a view of the group's buffer)."""

    def bind(self, strategy) -> None:
        self.strategy = strategy
        ctx = strategy.context
        self.grad_buffers = [GradBuffer(group, ctx.dist_context.device, ctx.precision.grad_accum_dtype)
                             for group in strategy.groups]

    def arms_on_boundary(self) -> bool:
        """Whether the boundary's backward reduces buckets at all."""
        return True

    def pre_backward(self, is_boundary: bool) -> None:
        for grads in self.grad_buffers:
            grads.attach()
        if is_boundary and self.arms_on_boundary():
            self.strategy.queue.arm()

    def on_grad(self, group_index: int, slot: int) -> None:
        """A parameter's gradient is ready: take it into its buffer and mark its bucket."""
        self.grad_buffers[self.strategy.group_position(group_index)].absorb(slot)
        self.strategy.queue.mark((group_index, slot))

    def launch(self, bucket_index: int) -> None:
        """Bucket ``bucket_index`` is complete: send it, in the communication dtype, pre-scaled."""
        strategy = self.strategy
        group_index, bucket = strategy.plan[bucket_index]
        position = strategy.group_position(group_index)
        grads = self.grad_buffers[position]
        for index in range(bucket.first, bucket.last):  # late or unused parameters
            grads.absorb(index)
        grads.settle(bucket.first, bucket.last)         # unused ones since zero(): zeros
        chunk = grads.buffer[bucket.start:bucket.end]
        comm_dtype = strategy.context.precision.comm_dtype
        work = chunk if chunk.dtype == comm_dtype else chunk.to(comm_dtype)
        if strategy.pre_scale != 1.0:
            work.mul_(strategy.pre_scale)
        self.send(position, bucket.start, chunk, work)

    def send(self, position: int, start: int, chunk: torch.Tensor, work: torch.Tensor) -> None:  # pragma: no cover
        raise NotImplementedError

    def owned(self, position: int) -> torch.Tensor:
        """The gradient over the flat range the master of group ``position`` covers."""
        low, high = self.strategy.partitioning.bounds(self.strategy.groups[position])
        grads = self.grad_buffers[position]
        grads.settle()   # a parameter no backward reached since zero(): its slot reads zero
        return grads.buffer[low:high]

    def zero(self) -> None:
        for grads in self.grad_buffers:
            grads.zero()

    def nbytes(self) -> int:
        return sum(g.buffer.numel() * g.buffer.element_size() for g in self.grad_buffers)

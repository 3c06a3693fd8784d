"""ZeRO stage 0 (data parallel): gradients all-reduced in buckets while backward runs."""
from __future__ import annotations

import torch

from launcher.zero.collectives import all_reduce_async
from launcher.zero.layout.flat import GradBuffer, ParamGroup
from launcher.zero.stages.whole_params import FlatStrategy
from launcher.zero.stages.base import Fragment


class Stage0Strategy(FlatStrategy):
    """Every rank holds everything; masters are the parameters themselves in fp32 training."""

    stage = 0

    @property
    def partitioned_grads(self) -> bool:  # local (unreduced) grads when the optimizer communicates
        return not self.context.reduce_gradients

    def partition_count(self) -> int:
        return 1

    def build_master(self, group: ParamGroup) -> torch.Tensor:
        buffer = self.param_buffers[self.group_position(group.index)]
        precision = self.context.precision
        self.aliased = (buffer.dtype == precision.master_dtype and precision.grad_accum_dtype == precision.master_dtype)
        if self.aliased:
            return buffer
        return buffer.detach().to(precision.master_dtype).clone()

    def after_setup(self) -> None:
        ctx = self.context
        self.grad_buffers = [GradBuffer(group, ctx.dist.device, ctx.precision.grad_accum_dtype) for group in self.groups]

    def pre_backward(self, is_boundary: bool) -> None:
        self.attach_grad_buffers(arm=is_boundary and self.communicates)

    def on_grad(self, group_index: int, slot: int) -> None:
        self.absorb_grad(group_index, slot)

    def launch(self, bucket_index: int) -> None:
        group_index, bucket = self.plan[bucket_index]
        grads = self.grad_buffers[self.group_position(group_index)]
        for index in range(bucket.first, bucket.last):  # a parameter unused in this forward
            grads.absorb(index)
        chunk = grads.buffer[bucket.start:bucket.end]
        work = chunk if chunk.dtype == self.context.precision.comm_dtype else chunk.to(self.context.precision.comm_dtype)
        if self.pre_scale != 1.0:
            work.mul_(self.pre_scale)
        handle = all_reduce_async(work, self.context.dist)

        def done(chunk=chunk, work=work):
            if self.post_scale != 1.0:
                work.mul_(self.post_scale)
            if work is not chunk:
                chunk.copy_(work)
        self.pending.append((handle, done))

    def post_backward(self, is_boundary: bool) -> None:
        self.queue.flush()
        self.finish_pending()

    def prepare_master_grads(self) -> None:
        for master, grads in zip(self.masters, self.grad_buffers):
            master.grad = grads.buffer if self.aliased else grads.buffer.to(master.dtype)

    def after_optimizer_step(self) -> None:
        if not self.aliased:
            with torch.no_grad():
                for buffer, master in zip(self.param_buffers, self.masters):
                    buffer.copy_(master)

    def zero_grad(self) -> None:
        for master, grads in zip(self.masters, self.grad_buffers):
            grads.zero()
            if not self.aliased:
                master.grad = None

    def fragments(self) -> list[Fragment]:
        found = []
        for group, master in zip(self.groups, self.masters):
            found += self.fragments_for(group, master, 0, group.layout.padded_numel)
        return found

    def memory_breakdown(self) -> dict[str, int]:
        params = sum(b.numel() * b.element_size() for b in self.param_buffers) + self.frozen_param_bytes()
        grads = sum(g.buffer.numel() * g.buffer.element_size() for g in self.grad_buffers)
        masters = 0 if self.aliased else sum(m.numel() * m.element_size() for m in self.masters)
        return {"parameters": params, "gradients": grads, "master_weights": masters,
                "optimizer_states": self.optimizer_state_bytes()}

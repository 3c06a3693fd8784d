"""ZeRO stage 1: optimizer state partitioned; full gradients reduced to their owners at the boundary."""
from __future__ import annotations



from launcher.zero.layout.flat import GradBuffer
from launcher.zero.stages.partitioned_masters import PartitionedStrategy


class Stage1Strategy(PartitionedStrategy):
    """Gradients accumulate whole on every rank; on the boundary each bucket is reduced piecewise
    to the ranks owning it, and the owner's slice of the gradient buffer becomes its master grad."""

    stage = 1

    def after_setup(self) -> None:
        ctx = self.context
        self.grad_buffers = [GradBuffer(group, ctx.dist.device, ctx.precision.grad_accum_dtype) for group in self.groups]

    def pre_backward(self, is_boundary: bool) -> None:
        self.attach_grad_buffers(arm=is_boundary)

    def on_grad(self, group_index: int, slot: int) -> None:
        self.absorb_grad(group_index, slot)

    def launch(self, bucket_index: int) -> None:
        group_index, bucket = self.plan[bucket_index]
        position = self.group_position(group_index)
        grads = self.grad_buffers[position]
        for index in range(bucket.first, bucket.last):
            grads.absorb(index)
        chunk = grads.buffer[bucket.start:bucket.end]
        comm_dtype = self.context.precision.comm_dtype
        work = chunk if chunk.dtype == comm_dtype else chunk.to(comm_dtype)
        if self.pre_scale != 1.0:
            work.mul_(self.pre_scale)
        group = self.groups[position]
        low, _ = self.partition_bounds(group)

        def accumulate(group, offset, reduced, position=position, low=low):
            target = self.grad_buffers[position].buffer[low + offset:low + offset + reduced.numel()]
            if reduced.data_ptr() != target.data_ptr():
                target.copy_(reduced)
        self.reduce_to_owners(group, work, bucket.start, accumulate)

    def post_backward(self, is_boundary: bool) -> None:
        self.queue.flush()
        self.finish_pending()

    def prepare_master_grads(self) -> None:
        for group, master, grads in zip(self.groups, self.masters, self.grad_buffers):
            low, high = self.partition_bounds(group)
            own = grads.buffer[low:high]
            # fp32: the slice itself; mixed precision: a transient fp32 copy for the step
            master.grad = own if own.dtype == master.dtype else own.to(master.dtype)

    def zero_grad(self) -> None:
        for master, grads in zip(self.masters, self.grad_buffers):
            grads.zero()
            master.grad = None

    def memory_breakdown(self) -> dict[str, int]:
        grads = sum(g.buffer.numel() * g.buffer.element_size() for g in self.grad_buffers)
        return {"parameters": self.param_bytes(), "gradients": grads, "master_weights": self.master_bytes(),
                "optimizer_states": self.optimizer_state_bytes()}




"""Stage 3's gradient reductions, mixed into Stage3Strategy (strategy.py): a partitioned
parameter's full gradient reduce-scattered into its owner's shard as soon as autograd has
accumulated it (bucketed by ``reduce_bucket_size`` under ``overlap_comm``; to pinned host memory
with offload), a ZeRO-3 leaf module's held to the end of backward and reduced there in one fixed
order, and the persistent parameters' whole gradients all-reduced once per boundary."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from launcher.zero.stages.base import square_sum as tensor_square_sum
from launcher.zero.stages.stage3 import params as P
from launcher.zero.stages.stage3.gather_scatter import reduce_scatter_shard


class Stage3GradReduce:
    """Mixed into Stage3Strategy: uses its group_params / group_slots / grads and the pending queue."""

    def _start_reductions(self) -> None:
        """The queue of reduce-scatters in flight, the leaf modules' slots, and on each partitioned
        parameter the hooks that give its gradient its shape and reduce it once accumulated."""
        self._hooks = []
        self._pending: list[tuple[Any, torch.Tensor, torch.Tensor, Any]] = []
        self._pending_numel = 0
        self._keep_alive: list[torch.Tensor] = []
        self._touched: set[tuple[int, int]] = set()    # shards with a gradient since zero_grad
        self._device_squares, self._norm_on_device = 0.0, True   # see _finish_pending
        self._find_leaf_slots()
        for position, params in enumerate(self.group_params):
            for slot_index, p in enumerate(params):
                if P.is_partitioned(p):
                    self._hooks.append(p.register_hook(lambda grad, param=p: P.give_shape(param)))
                    self._hooks.append(p.register_post_accumulate_grad_hook(
                        lambda param, g=position, s=slot_index: self._on_grad(g, s)))

    def _find_leaf_slots(self) -> None:
        """The (group, slot) of each partitioned parameter inside a ZeRO-3 leaf module, in a
        fixed order. Which of a leaf's children run can differ between ranks, so their
        gradients are kept until the end of backward and reduced there, in this order, a zero
        gradient for a parameter this rank did not use: every rank then calls the same
        reduce-scatters in the same order."""
        leaves = [m for m in self.module.modules() if getattr(m, "_z3_leaf", False)]
        leaf_params = {id(p) for leaf in leaves for p in leaf.parameters()}
        self._leaf_slots = {(position, slot_index): None
                            for position, params in enumerate(self.group_params)
                            for slot_index, p in enumerate(params)
                            if id(p) in leaf_params and P.is_partitioned(p)}

    def _reduce_leaf_grads(self) -> None:
        for key, grad in self._leaf_slots.items():
            p = self.group_params[key[0]][key[1]]
            self._reduce(key[0], key[1], grad if grad is not None else torch.zeros(
                P.full_shape(p), dtype=p.dtype, device=self.context.dist_context.device))
            self._leaf_slots[key] = None

    def _on_grad(self, position: int, slot_index: int) -> None:
        """A partitioned parameter's full gradient is ready: reduce-scatter it into the owner shards
        (a leaf module's: at the end of backward, ``_find_leaf_slots``)."""
        p = self.group_params[position][slot_index]
        grad, p.grad = p.grad, None
        self.coordinator.release(p)
        if grad is None:
            return
        key = (position, slot_index)
        if key in self._leaf_slots:
            held = self._leaf_slots[key]
            self._leaf_slots[key] = grad if held is None else held + grad
            return
        self._reduce(position, slot_index, grad)

    def _reduce(self, position: int, slot_index: int, grad: torch.Tensor) -> None:
        slot = self.group_slots[position][slot_index]
        ctx = self.context
        world = ctx.dist_context.world_size
        target = self.grads[position][slot.offset:slot.offset + slot.length]
        if world == 1 and target.device == grad.device:   # nothing to scatter: straight into the shard
            target[:slot.numel].add_(grad.reshape(-1), alpha=self.pre_scale * self.post_scale)
            return
        if world == 1:   # offload: cast on the device, then one copy to the host shard (_finish_pending)
            out = grad.reshape(-1).to(target.dtype)
            if self.pre_scale != 1.0:
                out.mul_(self.pre_scale)
            self._pending.append((None, out, target[:slot.numel], (position, slot_index)))
            self._finish_pending()
            return
        padded = torch.zeros(slot.length * world, dtype=ctx.precision.comm_dtype, device=grad.device)
        padded[:slot.numel].copy_(grad.reshape(-1))
        if self.pre_scale != 1.0:
            padded.mul_(self.pre_scale)
        out = torch.empty(slot.length, dtype=padded.dtype, device=padded.device)
        work = reduce_scatter_shard(out, padded, ctx.parallel.group("data"), async_op=True)
        self._pending.append((work, out, target, (position, slot_index)))
        self._keep_alive.append(padded)
        self._pending_numel += padded.numel()
        bucket = int(ctx.config.zero_optimization.reduce_bucket_size)
        if not ctx.config.overlap_comm or self._pending_numel >= bucket:
            self._finish_pending()

    def _finish_pending(self) -> None:
        """Wait for the reduce-scatters and add each result into its shard's gradient.

        With offload the results go to host memory: the first contribution to a shard since
        zero_grad is copied straight into the pinned gradient buffer, later ones land in a
        temporary and are added; all device-to-host copies are queued first and waited for once.
        """
        pending, self._pending, self._pending_numel = self._pending, [], 0
        staged = []
        for work, out, target, key in pending:
            if work is not None:
                work.wait()
            if self.post_scale != 1.0:
                out.mul_(self.post_scale)
            if out.device == target.device:
                target.add_(out)
            elif key not in self._touched:
                # the first contribution this step: measured here, on the device, for the norm
                self._device_squares = self._device_squares + tensor_square_sum(out)
                self._copy_to_host(target, out)
            else:
                self._norm_on_device = False            # accumulated on the host: measure it there
                staged.append((target, out.to(device=target.device, non_blocking=True)))
            self._touched.add(key)
        self._keep_alive = []     # the padded inputs can go once their collectives were waited for
        if staged and torch.cuda.is_available():
            if self._copy_stream is not None:
                self._copy_stream.synchronize()         # a first contribution may still be landing
            torch.cuda.current_stream().synchronize()   # the host adds read the copies
        for target, host in staged:
            target.add_(host)

    def _reduce_persistent(self) -> None:
        """All-reduce the whole gradients of persistent parameters once per boundary, in one buffer,
        then add them into the group gradients with one copy (to the host with offload) and one
        foreach add: no per-parameter copies or host syncs."""
        ctx = self.context
        pairs = [(p, position, slot) for position, params in enumerate(self.group_params)
                 for p, slot in zip(params, self.group_slots[position]) if slot.persistent]
        if not pairs:
            return
        flat = torch.cat([p.grad.reshape(-1).to(ctx.precision.comm_dtype) if p.grad is not None
                          else torch.zeros(slot.numel, dtype=ctx.precision.comm_dtype, device=ctx.dist_context.device)
                          for p, _, slot in pairs])
        if ctx.dist_context.world_size > 1 and ctx.reduce_gradients:
            if self.pre_scale != 1.0:
                flat.mul_(self.pre_scale)
            dist.all_reduce(flat, group=ctx.parallel.group("data"))
            if self.post_scale != 1.0:
                flat.mul_(self.post_scale)
        pieces = flat.split([slot.numel for _, _, slot in pairs])
        places: dict[tuple, list[int]] = {}   # the pairs by their gradient buffer's device and dtype
        for index, (_, position, _) in enumerate(pairs):
            places.setdefault((self.grads[position].device, self.grads[position].dtype), []).append(index)
        for (device, dtype), indices in places.items():   # two places only with offload_optimizer.ratio
            part = flat if len(places) == 1 else torch.cat([pieces[i] for i in indices])
            part = part.to(device=device, dtype=dtype)   # one copy a place (synchronous to the host)
            slots = [(pairs[i][1], pairs[i][2]) for i in indices]
            targets = [self.grads[position][slot.offset:slot.offset + slot.numel] for position, slot in slots]
            torch._foreach_add_(targets, list(part.split([slot.numel for _, slot in slots])))
        for p, _, _ in pairs:
            p.grad = None

    def _copy_to_host(self, target: torch.Tensor, out: torch.Tensor) -> None:
        """Device gradient -> pinned host shard on the copy stream, so it overlaps the backward's
        kernels instead of queueing between them (``prepare_master_grads`` waits for it)."""
        stream = self._copy_stream
        if stream is None:
            target.copy_(out, non_blocking=True)
            return
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            target.copy_(out, non_blocking=True)
        out.record_stream(stream)   # its memory is reused only after the copy


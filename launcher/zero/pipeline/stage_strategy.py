"""A pipeline stage's ZeRO 0/1 over the data axis, as a strategy like the others (stages/base.py).

The pipeline engine runs its micro-batches itself (schedule.py); at the step it hands this strategy
to the one optimizer step (engine/optimizer_step.py), which calls, in order:

    prepare_master_grads()     the stage's gradients averaged over the data axis (fp32 beside 16-bit
                               weights), tied copies summed across their stages; at ZeRO-1 this data
                               rank's slice of them on the shard's master
    grad_norm_and_overflow()   the one norm over the data, tensor and pipeline axes
    scale_master_grads(f)      unscale and clip, then optimizer.step()
    after_optimizer_step()     masters into the stage's parameters (ZeRO-1: every slice gathered)
    zero_grad()

*Holder*: the tensor whose ``.grad`` the step reads for one parameter: the parameter itself (fp32),
its fp32 master (fp16/bf16 at stage 0) or a GradHolder (fp16/bf16 at stage 1, whose only fp32
weights are the shard's slice).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from launcher.zero.pipeline.shard import OptimizerShard
from launcher.zero.stages.base import Fragment, GradStats, StrategyContext, ZeroStrategy
from launcher.zero.stages.tensor_parallel_norm import add_squares, tensor_parallel_stats


class PipelineStageStrategy(ZeroStrategy):
    """ZeRO 0 (``shard`` None) or 1 (``shard``: this data rank's slice) for one pipeline stage."""

    stage = 0
    partitioned_grads = False

    def __init__(self, context: StrategyContext, masters: list | None, grad_holders: list | None,
                 shard: OptimizerShard | None, tied: dict[str, tuple[list[int], Any, list[torch.Tensor]]]):
        super().__init__(context)
        self.stage = 1 if shard is not None else 0
        self.masters = masters
        self.grad_holders = grad_holders
        self.shard = shard
        #: tie key -> (its stages' global ranks, their group, this stage's copies of the tied weights)
        self.tied = tied

    def setup(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """The pipeline's assembly built the masters and the shard; this keeps the module and optimizer."""
        self.module, self.optimizer = module, optimizer

    def post_backward(self, is_boundary: bool) -> None:
        """Gradients stay where backward left them until the step (one reduction per batch)."""

    def holders(self) -> list[tuple[torch.nn.Parameter, Any]]:
        """(parameter, its holder) for every trainable parameter of the stage, in order."""
        params = [p for p in self.module.parameters() if p.requires_grad]
        holders = self.masters if self.masters is not None else self.grad_holders
        return list(zip(params, holders if holders is not None else params))

    def master_tensors(self) -> list[torch.Tensor]:
        return [self.shard.param] if self.shard is not None else [holder for _, holder in self.holders()]

    def prepare_master_grads(self, defer_cast: bool = False) -> None:
        holders = self.holders()
        for param, holder in holders:
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            if holder is not param:            # 16-bit gradients become fp32 before any sum
                holder.grad, param.grad = grad.float(), None
            else:
                param.grad = grad
        grads = [holder.grad for _, holder in holders]
        data_size = self.context.parallel.size("data")
        if data_size > 1 and grads:
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=self.context.parallel.group("data"))
            flat /= data_size
            for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(reduced)
        holder_of = {id(param): holder for param, holder in holders}
        for _, group, copies in self.tied.values():
            for param in copies:
                dist.all_reduce(holder_of[id(param)].grad, group=group)
        if self.shard is not None:    # the optimizer steps this data rank's slice of the gradients
            self.shard.param.grad = self.shard.partition_of([holder.grad for _, holder in holders])

    def grad_square_sum(self) -> None:
        return None   # three axes: the step asks grad_norm_and_overflow

    def grad_norm_and_overflow(self) -> GradStats:
        """The one global L2 norm over all three axes (times the fp16 loss scale).

        Data replicas hold equal (averaged) gradients, so the data axis is not summed; tensor
        shards are summed over the tensor group while replicated parameters count once; stages
        are summed; a tied weight counts once (on its first stage)."""
        later_copies = {id(p) for ranks, _, copies in self.tied.values() if ranks[0] != dist.get_rank() for p in copies}
        totals = torch.zeros(3, dtype=torch.float64, device=self.context.dist_context.device)
        for param, holder in self.holders():
            grad = holder.grad.detach()
            if id(param) in later_copies:    # its squares count on the first stage; a non-finite one everywhere
                totals[2] += (~torch.isfinite(grad).all()).to(totals.dtype)
            else:
                add_squares(totals, grad, bool(getattr(param, "tensor_model_parallel", False)))
        parallel = self.context.parallel   # an axis of size 1 has no group to sum over
        model = parallel.group("tensor") if parallel.size("tensor") > 1 else None
        pipe = parallel.group("pipe") if parallel.size("pipe") > 1 else None
        return tensor_parallel_stats(totals, model, pipe)

    def after_optimizer_step(self) -> None:
        if self.shard is not None:
            self.shard.gather()
        elif self.masters is not None:
            with torch.no_grad():
                for param, master in self.holders():
                    param.copy_(master)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.shard is not None:      # the optimizer holds the slice; the stage's own gradients go here
            self.shard.param.grad = None
            for param, holder in self.holders():
                param.grad = holder.grad = None

    def fragments(self) -> list[Fragment]:
        """None: a pipeline checkpoint is per layer (checkpoint/pipeline_save_load.py), not fragments."""
        return []

    def memory_breakdown(self) -> dict[str, int]:
        params = [p for p in self.module.parameters() if p.requires_grad]
        own = {id(p) for p in params}
        masters = sum(m.numel() * m.element_size() for m in self.master_tensors() if id(m) not in own)
        return {"parameters": sum(p.numel() * p.element_size() for p in params), "gradients": 0,
                "master_weights": masters, "optimizer_states": self.optimizer_state_bytes()}

"""ZeRO stage 1 inside a pipeline stage, from the data-parallel engine's stage-1 pieces.

The stage's trainable tensors (the parameters, or their fp32 masters in 16-bit) get the flat layout
of stages 1-2 over the data-parallel ranks (``layout.partition_math.flat_layout``: laid end to end,
padded to a multiple of the data size); this data rank's master is its partition of one fp32 flat
buffer (``stages.sharding.Sharded.bounds``), so the optimizer's state (Adam's moments) is 1/data of
the stage's, and after the step ``Sharded.gather`` all-gathers the partitions into every rank's
buffer, which is copied back into the tensors.

What is the pipeline's own: gradients are averaged whole over the data axis before the step (the
pipeline's clip norm reads every one), the tensors keep their own storage (tied weights, 16-bit
parameters), and only elementwise optimizers (Adam, AdamW, SGD) are accepted: they step exactly as
unsharded, while one with per-tensor statistics (Lamb's trust ratio) would see slices.
"""
from __future__ import annotations

import torch

from launcher.zero.distributed.collectives import all_gather_into
from launcher.zero.errors import ConfigError
from launcher.zero.layout.flat import ParamGroup
from launcher.zero.layout.partition_math import flat_layout
from launcher.zero.stages.base import StrategyContext
from launcher.zero.stages.sharding import Sharded

#: optimizers whose update of an element depends only on that element (and scalars)
ELEMENTWISE = {"adam", "adamw", "sgd", "fusedadam", "adagrad", "rmsprop"}


def check_shardable(optimizer_config) -> None:
    """Stage 1 with a pipeline steps slices of tensors: only elementwise optimizers stay exact."""
    name = str(optimizer_config.type or "").lower() if optimizer_config is not None else ""
    if name and name not in ELEMENTWISE:
        raise ConfigError(f"zero_optimization.stage 1 with pipeline parallelism: optimizer {optimizer_config.type!r} "
                          "computes per-tensor statistics, which a data-axis slice does not have",
                          hint=f'use one of {sorted(ELEMENTWISE)}, or "zero_optimization": {{"stage": 0}}')


class GradHolder:
    """An fp32 gradient for a 16-bit parameter, without an fp32 copy of its weight (ZeRO-1 in 16-bit:
    the only fp32 weights are this data rank's slice, ``OptimizerShard.param``)."""

    __slots__ = ("grad",)

    def __init__(self):
        self.grad = None


class OptimizerShard:
    """This data rank's partition of a stage's tensors as one fp32 master, and the step that shares
    its result (``context.dist_context``: the data-parallel ranks)."""

    def __init__(self, tensors: list[torch.Tensor], context: StrategyContext):
        self.tensors = tensors
        self.dist_context = context.dist_context
        names = [str(index) for index in range(len(tensors))]
        layout = flat_layout(names, [tuple(t.shape) for t in tensors], self.dist_context.world_size)
        self.group = ParamGroup(index=0, names=names, params=tensors, layout=layout, dist_context=self.dist_context)
        self.sharding = Sharded(context)
        self.low, self.high = self.sharding.bounds(self.group)
        device = tensors[0].device if tensors else self.dist_context.device
        self.buffer = torch.zeros(layout.padded_numel, dtype=torch.float32, device=device)
        #: what the optimizer steps: this rank's partition of the buffer, so its state is this size
        self.param = torch.nn.Parameter(self.buffer[self.low:self.high])
        self.refresh()

    @property
    def numel(self) -> int:
        return self.group.layout.numel

    @property
    def partition_numel(self) -> int:
        return self.group.layout.partition_numel

    def refresh(self) -> None:
        """Take the buffer (and so the partition) again from the tensors, e.g. after a checkpoint loaded
        new weights into them."""
        with torch.no_grad():
            for tensor, slot in zip(self.tensors, self.group.layout.slots):
                self.buffer[slot.offset:slot.end].copy_(tensor.detach().reshape(-1))

    def partition_of(self, values: list) -> torch.Tensor:
        """This rank's partition of per-tensor ``values`` laid out flat (None counts as zeros)."""
        layout, part = self.group.layout, torch.zeros_like(self.param)
        for piece in layout.pieces_of_rank(self.dist_context.rank):
            value, slot = values[piece.slot], layout.slots[piece.slot]
            if value is not None:
                start = piece.flat_start - slot.offset
                part[piece.flat_start - self.low:piece.flat_end - self.low].copy_(
                    value.reshape(-1)[start:start + piece.numel])
        return part

    def gather(self) -> None:
        """After the optimizer stepped this partition (its ``.grad``: ``partition_of`` the stage's averaged
        gradients): every data rank's partition into the buffer, then into the tensors (fp32 values
        rounded into 16-bit tensors where the gradients were kept apart from them)."""
        with torch.no_grad():
            self.sharding.gather(self.buffer, self.low, self.high, self.dist_context)
            for tensor, slot in zip(self.tensors, self.group.layout.slots):
                tensor.copy_(self.buffer[slot.offset:slot.end].view_as(tensor))
        self.param.grad = None

    # ---- checkpoints: the state saved whole (unpadded), so any data size slices its own part ----
    def full_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """Collective over the data ranks: the optimizer state with every partition-sized tensor gathered."""
        state = optimizer.state_dict()
        for per_param in state["state"].values():
            for key, value in list(per_param.items()):
                if torch.is_tensor(value) and value.numel() == self.partition_numel and value.dim() == 1:
                    whole = torch.empty(self.group.layout.padded_numel, dtype=value.dtype, device=value.device)
                    all_gather_into(whole, value, self.dist_context)
                    per_param[key] = whole[:self.numel].cpu()
        return {"sharded_over_data": True, "numel": self.numel, "optimizer": state}

    def load_full_state(self, optimizer: torch.optim.Optimizer, saved: dict) -> None:
        """Take this rank's partition of a state saved by ``full_state`` (at any data size)."""
        state = saved["optimizer"]
        if saved["numel"] != self.numel:
            raise ConfigError(f"checkpoint: the stage's optimizer state has {saved['numel']} elements, "
                              f"this stage {self.numel}", hint="load_checkpoint(..., load_optimizer_states=False)")
        for per_param in state["state"].values():
            for key, value in list(per_param.items()):
                if torch.is_tensor(value) and value.dim() == 1 and value.numel() == self.numel:
                    padded = torch.zeros(self.group.layout.padded_numel, dtype=value.dtype)
                    padded[:self.numel] = value
                    per_param[key] = padded[self.low:self.high].clone()
        optimizer.load_state_dict(state)

"""ZeRO stage 1 inside a pipeline stage: the optimizer state partitioned over the data axis.

The stage's trainable fp32 tensors (the parameters, or their fp32 masters in 16-bit) are laid end
to end in one flat buffer padded to a multiple of the data-parallel size; data rank r owns the
contiguous slice ``[r * n, (r + 1) * n)``. The optimizer is built over that one slice, so its
state (Adam's moments) is 1/data of the stage's. Gradients are still averaged whole over the data
axis (the clip norm needs every one); after the step the updated slices are all-gathered and
copied back into the tensors. Elementwise optimizers (Adam, AdamW, SGD) step exactly as unsharded;
ones with per-tensor statistics (Lamb's trust ratio) would see slices, so they are refused.
"""
from __future__ import annotations

import torch

from launcher.zero.distributed.collectives import all_gather_single
from launcher.zero.errors import ConfigError

#: optimizers whose update of an element depends only on that element (and scalars)
ELEMENTWISE = {"adam", "adamw", "sgd", "fusedadam", "adagrad", "rmsprop"}


def check_shardable(optimizer_config) -> None:
    """Stage 1 with a pipeline steps slices of tensors: only elementwise optimizers stay exact."""
    name = str(getattr(optimizer_config, "type", "") or "").lower()
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
    """This data rank's slice of a stage's flat fp32 tensors, and the step that shares its result."""

    def __init__(self, tensors: list[torch.Tensor], data_rank: int, data_size: int):
        self.tensors = tensors
        self.numel = sum(t.numel() for t in tensors)
        self.data_size = data_size
        self.partition_numel = -(-max(self.numel, 1) // data_size)
        self.low = data_rank * self.partition_numel
        flat = self._flat([t.detach().float() for t in tensors])
        #: what the optimizer steps: a leaf of its own, not a view, so its state is this size
        self.param = torch.nn.Parameter(flat[self.low:self.low + self.partition_numel].clone())

    def refresh(self) -> None:
        """Take the slice again from the tensors (after a checkpoint loaded new weights into them)."""
        flat = self._flat([t.detach().float() for t in self.tensors])
        with torch.no_grad():
            self.param.copy_(flat[self.low:self.low + self.partition_numel])

    def _flat(self, parts: list[torch.Tensor]) -> torch.Tensor:
        device = parts[0].device if parts else torch.device("cpu")
        flat = torch.zeros(self.partition_numel * self.data_size, dtype=torch.float32, device=device)
        offset = 0
        for part in parts:
            flat[offset:offset + part.numel()].copy_(part.reshape(-1))
            offset += part.numel()
        return flat

    def step(self, optimizer: torch.optim.Optimizer, group, grads: list | None = None) -> None:
        """Step the slice with its part of the (averaged, clipped) gradients; gather every slice back.

        ``grads`` (one per tensor) when they are kept apart from the tensors (fp32 beside 16-bit weights);
        the gathered fp32 slices are then rounded into the 16-bit tensors.
        """
        grads = [t.grad for t in self.tensors] if grads is None else grads
        grads = self._flat([g if g is not None else torch.zeros_like(t) for g, t in zip(grads, self.tensors)])
        self.param.grad = grads[self.low:self.low + self.partition_numel].clone()
        optimizer.step()
        gathered = self._gather(self.param.detach(), group)
        offset = 0
        with torch.no_grad():
            for tensor in self.tensors:
                tensor.copy_(gathered[offset:offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
        self.param.grad = None

    def _gather(self, slice_: torch.Tensor, group) -> torch.Tensor:
        """Every data rank's equal-size slice, end to end (rank order)."""
        gathered = torch.empty(self.partition_numel * self.data_size, dtype=slice_.dtype, device=slice_.device)
        if self.data_size == 1:
            return gathered.copy_(slice_)
        all_gather_single(gathered, slice_.contiguous(), group=group)
        return gathered

    # ---- checkpoints: the state saved whole (unpadded), so any data size slices its own part ----
    def full_state(self, optimizer: torch.optim.Optimizer, group) -> dict:
        """Collective over the data group: the optimizer state with every slice-sized tensor gathered."""
        state = optimizer.state_dict()
        for per_param in state["state"].values():
            for key, value in list(per_param.items()):
                if torch.is_tensor(value) and value.numel() == self.partition_numel and value.dim() == 1:
                    per_param[key] = self._gather(value, group)[:self.numel].cpu()
        return {"sharded_over_data": True, "numel": self.numel, "optimizer": state}

    def load_full_state(self, optimizer: torch.optim.Optimizer, saved: dict) -> None:
        """Take this rank's slice of a state saved by ``full_state`` (at any data size)."""
        state = saved["optimizer"]
        if saved["numel"] != self.numel:
            raise ConfigError(f"checkpoint: the stage's optimizer state has {saved['numel']} elements, "
                              f"this stage {self.numel}", hint="load_checkpoint(..., load_optimizer_states=False)")
        for per_param in state["state"].values():
            for key, value in list(per_param.items()):
                if torch.is_tensor(value) and value.dim() == 1 and value.numel() == self.numel:
                    padded = torch.zeros(self.partition_numel * self.data_size, dtype=value.dtype)
                    padded[:self.numel] = value
                    per_param[key] = padded[self.low:self.low + self.partition_numel].clone()
        optimizer.load_state_dict(state)

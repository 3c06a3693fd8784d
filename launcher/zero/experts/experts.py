"""The experts one rank holds: copies of one expert module, each fed its own slice of the buffer."""
from __future__ import annotations

import copy

import torch
from torch import nn


def mark_expert_params(module: nn.Module, group_name: str) -> None:
    """Tag ``module``'s parameters as expert parameters, as DeepSpeed does and scripts check:
    ``param.allreduce = False`` (not reduced over the whole data group) and ``param.group_name``
    (the expert-data group they are reduced over, e.g. ``ep_size_2``)."""
    for param in module.parameters():
        param.allreduce = False
        param.group_name = group_name


class Experts(nn.Module):
    """``num_local_experts`` deep copies of ``expert`` (all start equal, as in DeepSpeed).

    ``deepspeed_experts`` is DeepSpeed's attribute name, so state-dict keys match theirs
    (``...experts.deepspeed_experts.0.weight``)."""

    def __init__(self, expert: nn.Module, num_local_experts: int = 1, expert_group_name: str | None = None):
        super().__init__()
        self.deepspeed_experts = nn.ModuleList([copy.deepcopy(expert) for _ in range(num_local_experts)])
        self.num_local_experts = num_local_experts
        for local in self.deepspeed_experts:
            mark_expert_params(local, expert_group_name)

    def forward(self, buffer: torch.Tensor) -> torch.Tensor:
        """``buffer`` is ``[ranks, local experts, C, M]``: expert ``j`` gets ``buffer[:, j]`` (one call
        for the tokens of every sending rank). An expert returning a tuple gives its first item."""
        outputs = []
        for chunk, expert in zip(buffer.chunk(self.num_local_experts, dim=1), self.deepspeed_experts):
            out = expert(chunk)
            outputs.append(out[0] if isinstance(out, tuple) else out)
        return torch.cat(outputs, dim=1)

"""Flat buffers: a group's parameters (and gradients) viewed into one contiguous tensor.

Keeping the model's parameters as views into one buffer per optimizer group lets every
collective work on contiguous slices without copies (partitions, buckets, all-gathers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from launcher.zero.errors import ConfigError
from launcher.zero.layout.partition_math import FlatLayout, flat_layout


@dataclass
class ParamGroup:
    """One optimizer param group's trainable parameters and their flat layout."""

    index: int
    names: list[str]
    params: list[torch.nn.Parameter]
    layout: FlatLayout
    dist_context: Any = None   # the ranks it is reduced and partitioned over (MoE: expert-data ranks)


def trainable_groups(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> list[tuple[int, list]]:
    """(group index, trainable params) per optimizer group; each must be the model's, and once."""
    groups, seen = [], set()
    for index, group in enumerate(optimizer.param_groups):
        params = [p for p in group["params"] if p.requires_grad]
        for param in params:
            if id(param) not in names:
                raise ConfigError("model_parameters: a parameter given to the optimizer is not part of the model",
                                  hint="pass model.parameters() (or groups of them) as model_parameters")
            if id(param) in seen:
                raise ConfigError("model_parameters: a parameter appears in two optimizer param groups",
                                  hint="give every parameter to exactly one group")
            seen.add(id(param))
        groups.append((index, params))
    return groups


def collect_groups(module: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   world_size: int | Callable[[int], int]) -> list[ParamGroup]:
    """Match the optimizer's param groups to the module's named, trainable parameters.

    ``world_size``: the partitions of every group, or of group ``index`` as ``world_size(index)``."""
    names = {id(param): name for name, param in module.named_parameters()}
    groups = []
    for index, params in trainable_groups(optimizer, names):
        group_names = [names[id(p)] for p in params]
        partitions = world_size(index) if callable(world_size) else world_size
        layout = flat_layout(group_names, [tuple(p.shape) for p in params], partitions)
        groups.append(ParamGroup(index=index, names=group_names, params=params, layout=layout))
    return groups


def flatten_into_buffer(group: ParamGroup, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Copy the group's parameters into one padded buffer and make each parameter a view of it."""
    buffer = torch.zeros(group.layout.padded_numel, dtype=dtype, device=device)
    with torch.no_grad():
        for param, slot in zip(group.params, group.layout.slots):
            view = buffer[slot.offset:slot.end].view(slot.shape)
            view.copy_(param.detach())
            param.data = view
    return buffer


class GradBuffer:
    """Full-size gradients of one group in one flat tensor; each ``param.grad`` is a view of it.

    When the accumulation dtype differs from the parameter dtype the views cannot be used as
    ``.grad`` (autograd wants the parameter's dtype); then ``absorb`` adds ``param.grad`` in and
    drops it.
    """

    def __init__(self, group: ParamGroup, device: torch.device, dtype: torch.dtype):
        self.group = group
        self.buffer = torch.zeros(group.layout.padded_numel, dtype=dtype, device=device)
        self.views = [self.buffer[s.offset:s.end].view(s.shape) for s in group.layout.slots]
        self.as_grad = all(p.dtype == dtype for p in group.params)
        self.attach()

    def attach(self) -> None:
        """(Re)point every param.grad at its view (a user's zero_grad(set_to_none) drops them)."""
        if not self.as_grad:
            return
        for param, view in zip(self.group.params, self.views):
            if param.grad is None or param.grad.data_ptr() != view.data_ptr():
                if param.grad is not None:
                    view.add_(param.grad)
                param.grad = view

    def absorb(self, index: int) -> None:
        """Make sure parameter ``index``'s gradient is in the buffer (called from its grad hook)."""
        param, view = self.group.params[index], self.views[index]
        grad = param.grad
        if grad is None or grad.data_ptr() == view.data_ptr():
            return
        view.add_(grad)
        param.grad = view if self.as_grad else None

    def zero(self) -> None:
        self.buffer.zero_()
        self.attach()

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

    No zeroing pass per step (issue 39): ``zero`` marks every slot unwritten and drops the
    ``.grad`` views, so the next backward hands each parameter a fresh gradient, which ``absorb``
    copies into its view (read 2 + write 2 bytes an element, where zeroing and autograd's add
    into the view cost 2 + 6); from then on the view is ``.grad`` again and autograd adds into
    it. ``settle`` zeroes what no gradient reached before anything reads the buffer; the padding
    between slots is never written and stays zero.
    """

    def __init__(self, group: ParamGroup, device: torch.device, dtype: torch.dtype):
        self.group = group
        self.buffer = torch.zeros(group.layout.padded_numel, dtype=dtype, device=device)
        self.views = [self.buffer[s.offset:s.end].view(s.shape) for s in group.layout.slots]
        self.as_grad = all(p.dtype == dtype for p in group.params)
        self.unwritten: set[int] = set()   # slots holding no gradient since zero(): stale values
        self.attach()

    def attach(self) -> None:
        """(Re)point every written slot's param.grad at its view (a user's zero_grad(set_to_none)
        drops them); an unwritten slot's param.grad stays as backward leaves it."""
        if not self.as_grad:
            return
        for index, (param, view) in enumerate(zip(self.group.params, self.views)):
            if index in self.unwritten:
                continue
            if param.grad is None or param.grad.data_ptr() != view.data_ptr():
                if param.grad is not None:
                    view.add_(param.grad)
                param.grad = view

    def absorb(self, index: int) -> None:
        """Make sure parameter ``index``'s gradient is in the buffer (called from its grad hook)."""
        param, view = self.group.params[index], self.views[index]
        grad = param.grad
        if index in self.unwritten:
            if grad is None:   # no gradient this backward: the slot stays unwritten
                return
            self.unwritten.discard(index)
            view.copy_(grad)
        elif grad is None or grad.data_ptr() == view.data_ptr():
            return
        else:
            view.add_(grad)
        param.grad = view if self.as_grad else None

    def settle(self, first: int = 0, last: int | None = None) -> None:
        """Zero the slots in [first, last) no gradient reached since ``zero`` (before the buffer,
        or a bucket of it, is read)."""
        last = len(self.views) if last is None else last
        for index in sorted(i for i in self.unwritten if first <= i < last):
            self.views[index].zero_()
            self.unwritten.discard(index)
            if self.as_grad:
                self.group.params[index].grad = self.views[index]

    def zero(self) -> None:
        self.unwritten = set(range(len(self.views)))
        for param in self.group.params:
            param.grad = None

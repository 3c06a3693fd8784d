"""Tensors made safe to ``torch.save`` on their own: DeepSpeed's ``clone_tensors_for_torch_save``."""
from __future__ import annotations

from typing import Any

import torch


def clone_tensors_for_torch_save(item: Any, device: torch.device | str = torch.device("cpu")) -> Any:
    """``item`` with every tensor in it (nested in lists, tuples, dicts) copied to ``device``.

    A state dict may hold views of larger buffers (flat partitions, gathered parameters);
    ``torch.save`` would write each whole buffer. A copy owns exactly its elements.
    """
    if torch.is_tensor(item):
        device = torch.device(device)
        return item.detach().clone() if item.device == device else item.detach().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(value, device) for value in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(value, device) for value in item)
    if isinstance(item, dict):
        return type(item)({key: clone_tensors_for_torch_save(value, device) for key, value in item.items()})
    return item

"""``deepspeed.OnDevice``: build a model's tensors on a device and in a dtype, without moving them after.

DeepSpeed swaps ``torch.empty``/``zeros``/``ones``/``full`` and ``Tensor.__new__`` for the block;
torch has the same switches of its own, which also reach every other factory: the device as a
context manager and the default floating dtype. Integer tensors keep their dtype either way.
"""
from __future__ import annotations

import torch


class OnDevice:
    """``with OnDevice(dtype=torch.bfloat16, device="meta"): model = Model()`` builds the model's
    floating tensors as bf16 meta tensors (no memory); ``device="cuda:0"`` builds them in place.
    ``enabled=False`` makes the block a no-op."""

    def __init__(self, dtype: torch.dtype, device="meta", enabled: bool = True):
        self.dtype, self.device, self.enabled = dtype, device, enabled
        self._device_context = None
        self._previous_dtype = None

    def __enter__(self):
        if not self.enabled:
            return self
        self._previous_dtype = torch.get_default_dtype()
        if self.dtype is not None:
            torch.set_default_dtype(self.dtype)
        self._device_context = torch.device(self.device)
        self._device_context.__enter__()
        return self

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        if not self.enabled:
            return
        self._device_context.__exit__(exc_type, exc_value, traceback)
        torch.set_default_dtype(self._previous_dtype)

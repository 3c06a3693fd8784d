"""``deepspeed.accelerator.get_accelerator()``: the device a rank trains on, CUDA or CPU.

The methods are the ones DeepSpeed's tutorials and scripts call; each answers for CUDA when a
GPU is visible and for the CPU otherwise (where the CUDA-only ones are harmless no-ops).
"""
from __future__ import annotations

import os

import torch


class Accelerator:
    """One accelerator kind; ``get_accelerator()`` returns the one this rank uses."""

    def __init__(self, cuda: bool):
        self._cuda = cuda
        self._name = "cuda" if cuda else "cpu"
        self._communication_backend_name = "nccl" if cuda else "gloo"

    # ---- identity -----------------------------------------------------------------------
    def device_name(self, device_index: int | None = None) -> str:
        """'cuda' / 'cuda:N', or 'cpu' whatever the index (DeepSpeed's CPU accelerator does too)."""
        if self._cuda and device_index is not None:
            return f"cuda:{device_index}"
        return self._name

    def device(self, device_index: int | None = None) -> torch.device:
        return torch.device(self.device_name(device_index))

    def current_device(self) -> int:
        return torch.cuda.current_device() if self._cuda else 0

    def current_device_name(self) -> str:
        return f"cuda:{torch.cuda.current_device()}" if self._cuda else "cpu"

    def set_device(self, device_index: int) -> None:
        if self._cuda:
            torch.cuda.set_device(device_index)

    def device_count(self) -> int:
        if self._cuda:
            return torch.cuda.device_count()
        return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", 1)))

    def is_available(self) -> bool:
        return torch.cuda.is_available() if self._cuda else True

    def communication_backend_name(self) -> str:
        return self._communication_backend_name

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._cuda else True

    def is_fp16_supported(self) -> bool:
        return True

    def supported_dtypes(self) -> list[torch.dtype]:
        dtypes = [torch.float32, torch.float16]
        return dtypes + [torch.bfloat16] if self.is_bf16_supported() else dtypes

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    # ---- randomness ---------------------------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        torch.cuda.manual_seed(seed) if self._cuda else torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.cuda.manual_seed_all(seed) if self._cuda else torch.manual_seed(seed)

    def initial_seed(self) -> int:
        return torch.cuda.initial_seed() if self._cuda else torch.initial_seed()

    def get_rng_state(self, device_index: int | None = None) -> torch.Tensor:
        if self._cuda:
            return torch.cuda.get_rng_state(device_index if device_index is not None else "cuda")
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.set_rng_state(state, device_index if device_index is not None else "cuda")
        else:
            torch.set_rng_state(state)

    # ---- synchronization and memory ----------------------------------------------------
    def synchronize(self, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.synchronize(device_index)

    def empty_cache(self) -> None:
        if self._cuda:
            torch.cuda.empty_cache()

    def memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_allocated(device_index) if self._cuda else 0

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_allocated(device_index) if self._cuda else 0

    def reset_peak_memory_stats(self, device_index: int | None = None) -> None:
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(device_index)

    def total_memory(self, device_index: int | None = None) -> int:
        if self._cuda:
            return torch.cuda.get_device_properties(device_index or 0).total_memory
        import psutil

        return psutil.virtual_memory().total

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor.pin_memory() if self._cuda else tensor

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return tensor.is_pinned() if self._cuda else False

    # ---- streams and events ------------------------------------------------------------
    def Stream(self, *args, **kwargs):  # noqa: N802 - DeepSpeed's name
        return torch.cuda.Stream(*args, **kwargs) if self._cuda else _NullStream()

    def Event(self, *args, **kwargs):  # noqa: N802 - DeepSpeed's name
        return torch.cuda.Event(*args, **kwargs) if self._cuda else _NullEvent()

    def current_stream(self, device_index: int | None = None):
        return torch.cuda.current_stream(device_index) if self._cuda else _NullStream()

    def stream(self, stream):
        import contextlib

        return torch.cuda.stream(stream) if self._cuda else contextlib.nullcontext()


class _NullStream:
    """The CPU's stand-in for a CUDA stream: work is already ordered."""

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass


class _NullEvent:
    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


_ACCELERATOR: Accelerator | None = None


def get_accelerator() -> Accelerator:
    """CUDA when a GPU is visible (and DS_ACCELERATOR does not say 'cpu'), else the CPU."""
    global _ACCELERATOR
    if _ACCELERATOR is None:
        wanted = os.environ.get("DS_ACCELERATOR", "").lower()
        _ACCELERATOR = Accelerator(cuda=torch.cuda.is_available() and wanted != "cpu")
    return _ACCELERATOR


def set_accelerator(accelerator: Accelerator) -> None:
    global _ACCELERATOR
    _ACCELERATOR = accelerator


#: the devices DeepSpeed 0.19.8 has accelerators for (accelerator/real_accelerator.py)
SUPPORTED_ACCELERATOR_LIST = ["cuda", "cpu", "xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa", "klxpu"]


def is_current_accelerator_supported() -> bool:
    """DeepSpeed's check that the accelerator in use is one it supports: CUDA or the CPU here, always."""
    return get_accelerator().device_name() in SUPPORTED_ACCELERATOR_LIST

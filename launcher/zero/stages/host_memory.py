"""Page-locked host buffers of exactly the size asked for (offload's masters and gradients).

``torch.empty(..., pin_memory=True)`` goes through torch's caching host allocator, which rounds
each block up to the next power of two (and keeps freed blocks): a 22.6 GB fp32 master costs
32 GB of host memory, 1.7 bytes a parameter more than the master itself, where host memory is
what bounds the largest model offload can train (issue 32 item 4). Large buffers here are
mapped (anonymous, zeroed) and page-locked with ``cudaHostRegister`` at their exact size; the
pages are unlocked and unmapped when the last tensor viewing them is freed. Small ones, and
every one without CUDA, take torch's ordinary path.
"""
from __future__ import annotations

import ctypes
import mmap
import weakref

import torch

EXACT_FROM_BYTES = 64 << 20   # below this the power-of-two rounding costs little and blocks are reused

_libc = None


def _c_library():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long)
        libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        _libc = libc
    return _libc


def _release(address: int, nbytes: int) -> None:
    """The last view is gone: unlock, then unmap (a failed unlock still unmaps)."""
    try:
        torch.cuda.cudart().cudaHostUnregister(address)
    finally:
        _c_library().munmap(address, nbytes)


def _exact_pinned(numel: int, dtype: torch.dtype) -> torch.Tensor | None:
    """A zeroed tensor on freshly mapped, page-locked pages; None when mapping or locking fails."""
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    libc = _c_library()
    address = libc.mmap(None, nbytes, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                        -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        return None
    result = torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)
    if int(getattr(result, "value", result)) != 0:
        libc.munmap(address, nbytes)
        return None
    pages = (ctypes.c_uint8 * nbytes).from_address(address)
    # runs once no tensor holds the pages; at exit the process's pages go anyway, and CUDA may be gone
    weakref.finalize(pages, _release, address, nbytes).atexit = False
    return torch.frombuffer(pages, dtype=dtype)


def host_zeros(numel: int, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """A zeroed 1-D host tensor; page-locked when ``pin`` and a GPU exists, at its exact size
    when it is large (see the module docstring)."""
    pin = pin and torch.cuda.is_available()
    if pin and numel * torch.empty((), dtype=dtype).element_size() >= EXACT_FROM_BYTES:
        exact = _exact_pinned(numel, dtype)
        if exact is not None:
            return exact
    return torch.zeros(numel, dtype=dtype, pin_memory=pin)

"""Point-to-point tensors between neighbouring stages, with their shape sent first.

A message is a fixed-size int64 header (dtype code, ndim, dims) then the data, both on the default
group with global ranks, so it works on gloo (CPU) and NCCL alike. Sends are non-blocking (their
handles are kept until ``wait_sends``); receives block. ``group`` (a group of every rank; peers are
global ranks) keeps one kind of message in its own order.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from launcher.zero.errors import ConfigError

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool]
_MAX_DIMS = 8


class StageLink:
    """Sends and receives of one rank; ``device`` is where received tensors are placed."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pending: list[tuple] = []   # (work, tensor) kept alive until the send completes
        self.recv_wait_s = 0.0            # time blocked in receives: the stage's idle (bubble) time

    def send(self, tensor: torch.Tensor, peer: int, group=None) -> None:
        tensor = tensor.detach().contiguous()
        if tensor.dtype not in _DTYPES or tensor.dim() > _MAX_DIMS:
            raise ConfigError(f"pipeline: a stage output of dtype {tensor.dtype} and {tensor.dim()} dims cannot "
                              "pass between stages", hint=f"stage outputs are one tensor of <= {_MAX_DIMS} dims")
        header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=self.device)
        header[0] = _DTYPES.index(tensor.dtype)
        header[1] = tensor.dim()
        header[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
        for item in (header, tensor):
            self._pending.append((dist.isend(item, dst=peer, group=group), item))

    def recv(self, peer: int, group=None) -> torch.Tensor:
        started = time.perf_counter()
        header = torch.zeros(2 + _MAX_DIMS, dtype=torch.int64, device=self.device)
        dist.recv(header, src=peer, group=group)
        ndim = int(header[1])
        shape = [int(size) for size in header[2:2 + ndim]]
        tensor = torch.empty(shape, dtype=_DTYPES[int(header[0])], device=self.device)
        dist.recv(tensor, src=peer, group=group)
        self.recv_wait_s += time.perf_counter() - started
        return tensor

    def wait_sends(self) -> None:
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()

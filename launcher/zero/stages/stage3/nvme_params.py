"""ZeRO-Infinity's parameter offload to NVMe (``offload_param.device: nvme``, stage 3).

Every partitioned parameter's shard on this rank (the model-dtype values that ``device: cpu`` keeps
in host memory) lives in one file, ``<nvme_path>/dslaunch-rank<r>/params.shards``, the shards end
to end. The parameter's ``ds_state.shard`` (and ``ds_tensor``) is then a placeholder of the right
size, dtype and no memory; ``ds_state.swap`` points here. Host memory holds ``buffer_count``
staging buffers of ``buffer_size`` elements (DeepSpeed's meaning of the keys):

* a gather (params.start_gather) reads the shard into a free buffer and copies it out to where the
  all-gather runs, so the buffer is free again before the collective starts;
* the coordinator reads ahead: while a module computes, the shards of the next module it has not
  started gathering are read into the free buffers on one background thread (one buffer is
  always left for a gather that was not read ahead);
* after the optimizer step (and after any change to a parameter) the updated values are copied
  out and written on the same thread, in order, so the writes overlap what the caller does next
  (the next chunk's Adam step, the next forward) and a later read of the shard sees them; the
  pending writes hold at most as many bytes as the staging buffers (a write waits for the oldest
  beyond that); a read ahead of the same shard started before the write is dropped first; a failed
  write is raised by the next read (the next gather: the same place on every rank, so no rank is
  left waiting in a collective the failed one never reaches) or ``flush``.

Plain ``os.pread``/``os.pwrite`` as for the optimizer states (stages/nvme_states.py): the file is
written whole at start, so its space is reserved then; it is opened for each read and write, so
a folder removed mid-run fails the next gather or step by name (NvmeOffloadError).
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from launcher.zero.errors import ConfigError
from launcher.zero.stages.host_memory import host_zeros
from launcher.zero.stages.nvme_states import _bytes_view, _pread_all, _pwrite_all, io_guard

FILE_NAME = "params.shards"


class ParamFiles:
    """This rank's shards file, its staging buffers, and the thread that reads ahead."""

    def __init__(self, folder: str, buffer_count: int, buffer_size: int, pin: bool):
        self.folder, self.path = folder, os.path.join(folder, FILE_NAME)
        self.buffer_count, self.buffer_size, self.pin = int(buffer_count), int(buffer_size), pin
        self.places: dict[int, tuple[int, int, torch.dtype]] = {}   # id(state) -> (byte offset, numel, dtype)
        self.disk_bytes = 0
        self.buffers: list[torch.Tensor] = []   # made with the file: buffer_size elements of the widest dtype
        self._free: list[int] = []
        self._ahead: dict[int, tuple[Future, int]] = {}   # id(state) -> (its read, the buffer it fills)
        self.reads = self.reads_ahead = 0   # shards read for gathers, and how many of them had been read ahead
        self._writes: deque[tuple[Future, int]] = deque()   # pending writes, oldest first: (future, bytes)
        self.pending_bytes = self.most_pending_bytes = 0
        self._failure: BaseException | None = None   # the first write that failed, raised by every later read
        self._io = ThreadPoolExecutor(1, thread_name_prefix="dslaunch-nvme-params")

    # ---- set-up ---------------------------------------------------------------------------
    def adopt(self, params: list[torch.nn.Parameter]) -> None:
        """Write every partitioned parameter's shard to the file (whole, reserving its space) and
        leave a placeholder in its place; the shards stop taking host memory."""
        states = [p.ds_state for p in params]
        largest = max((s.shard_numel for s in states), default=0)
        if largest > self.buffer_size:
            raise ConfigError(f"zero_optimization.offload_param.buffer_size {self.buffer_size} is smaller than this "
                              f"rank's largest parameter shard ({largest} elements)",
                              hint=f"set offload_param.buffer_size to at least {largest}")
        with self._guard("write"):
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                for state in states:
                    shard = state.shard.detach().to("cpu").contiguous()
                    self.places[id(state)] = (self.disk_bytes, shard.numel(), shard.dtype)
                    _pwrite_all(fd, _bytes_view(shard), self.disk_bytes)
                    self.disk_bytes += shard.numel() * shard.element_size()
                os.fsync(fd)
            finally:
                os.close(fd)
        for p, state in zip(params, states):
            state.shard = p.ds_tensor = torch.zeros(1, dtype=state.shard.dtype).expand(state.shard_numel)
            state.swap = self
        width = max((dtype.itemsize for _, _, dtype in self.places.values()), default=1)
        self.buffers = [host_zeros(self.buffer_size * width, torch.uint8, self.pin) for _ in range(self.buffer_count)]
        self._free = list(range(self.buffer_count))

    def host_bytes(self) -> int:
        return sum(b.numel() for b in self.buffers)

    # ---- reads ----------------------------------------------------------------------------
    def read(self, state, device: torch.device) -> torch.Tensor:
        """The shard's values as a new tensor on ``device`` (from its read ahead when there is one)."""
        ahead = self._ahead.pop(id(state), None)
        self.reads, self.reads_ahead = self.reads + 1, self.reads_ahead + (ahead is not None)
        if ahead is not None:
            future, index = ahead
            try:
                future.result()
            except BaseException:
                self._free.append(index)
                raise
        else:
            index = self._take_buffer()
            try:   # on the I/O thread, after the writes queued before it
                self._io.submit(self._read_into, state, index).result()
            except BaseException:
                self._free.append(index)
                raise
        try:
            self._raise_failed_writes()
            return self._view(state, index).to(device, copy=True)
        finally:
            self._free.append(index)

    def read_ahead(self, params) -> None:
        """Start reading the released ones of the partitioned ``params`` on the background thread,
        while more than one buffer is free (the last is kept for a gather not read ahead)."""
        for p in params:
            state = p.ds_state
            if len(self._free) < 2:
                return
            if state.swap is not self or id(state) in self._ahead or state.status != "not_available":
                continue
            index = self._free.pop()
            self._ahead[id(state)] = (self._io.submit(self._read_into, state, index), index)

    def _take_buffer(self) -> int:
        if self._free:
            return self._free.pop()
        key = next(iter(self._ahead))   # every buffer holds a read ahead: the oldest gives its buffer up
        return self._drop(key)

    def _drop(self, key: int) -> int:
        future, index = self._ahead.pop(key)
        future.exception()   # waited for; an error there is the next read's to meet
        return index

    def _view(self, state, index: int) -> torch.Tensor:
        _, numel, dtype = self.places[id(state)]
        return self.buffers[index][: numel * dtype.itemsize].view(dtype)

    def _read_into(self, state, index: int) -> None:
        offset = self.places[id(state)][0]
        with self._guard("read"):
            fd = os.open(self.path, os.O_RDONLY)
            try:
                _pread_all(fd, _bytes_view(self._view(state, index)), offset, self.path)
            finally:
                os.close(fd)

    # ---- writes ---------------------------------------------------------------------------
    def write(self, state, values: torch.Tensor, start: int = 0) -> None:
        """Queue elements ``start...`` of the shard from ``values`` (a copy, cast to the shard's dtype)."""
        if id(state) in self._ahead:   # read before this change: stale
            self._free.append(self._drop(id(state)))
        offset, _, dtype = self.places[id(state)]
        data = torch.empty(values.numel(), dtype=dtype)
        data.copy_(values.detach().reshape(-1))   # the caller may reuse values at once
        while self._writes and self.pending_bytes + data.nbytes > self.write_budget():
            self._finish_oldest_write()
        self._writes.append((self._io.submit(self._write_at, data, offset + start * dtype.itemsize), data.nbytes))
        self.pending_bytes += data.nbytes
        self.most_pending_bytes = max(self.most_pending_bytes, self.pending_bytes)

    def write_budget(self) -> int:
        """The bytes pending writes may hold: as many as the staging buffers."""
        return max(1, self.host_bytes())

    def flush(self) -> None:
        """Wait for every queued write; the first that failed is raised."""
        self._drain()
        self._raise_failed_writes()

    def _drain(self) -> None:
        while self._writes:
            self._finish_oldest_write()

    def _write_at(self, data: torch.Tensor, offset: int) -> None:
        with self._guard("write"):
            fd = os.open(self.path, os.O_WRONLY)
            try:
                _pwrite_all(fd, _bytes_view(data), offset)
            finally:
                os.close(fd)

    def _finish_oldest_write(self) -> None:
        future, size = self._writes.popleft()
        self.pending_bytes -= size
        error = future.exception()
        self._failure = self._failure or error

    def _raise_failed_writes(self) -> None:
        while self._writes and self._writes[0][0].done():
            self._finish_oldest_write()
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        """The engine is destroyed: finish the writes (a failure is left to the read that meets it: a
        checkpoint reads every shard), stop the thread (the file stays for a later look)."""
        for key in list(self._ahead):
            self._free.append(self._drop(key))
        self._drain()
        self._io.shutdown(wait=True)

    def _guard(self, what: str):
        return io_guard(self.path, what, f"keep {self.folder} in place with room for {self.disk_bytes} bytes during "
                                         "training; resume from the last checkpoint (it holds the parameters)")

    def summary(self, numel: int) -> str:
        """The start line: where the parameters are, bytes on disk per parameter, the host buffers."""
        dtypes = sorted({str(dtype).replace("torch.", "") for _, _, dtype in self.places.values()})
        return (f"NVMe offload: parameters (this rank's shard of each partitioned one, {'/'.join(dtypes) or '-'}) in "
                f"{self.path} (one folder per rank), {self.disk_bytes / max(1, numel):.1f} bytes on disk per "
                f"parameter ({self.disk_bytes} bytes for this rank's {numel} elements); host memory for them: "
                f"{self.buffer_count} staging buffers (buffer_count) of {self.buffer_size} elements (buffer_size), "
                f"{self.host_bytes()} bytes; a module's shards are read before its all-gather, the next module's "
                "read ahead on one thread, and the updated shards written back on it after each step, "
                "while training goes on")

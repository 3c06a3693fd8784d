"""ZeRO-Infinity's optimizer-state offload to NVMe (``offload_optimizer.device: nvme``, stage 3).

Each optimizer group's flat master and Adam's two moments live in three files under
``<nvme_path>/dslaunch-rank<r>/``. Our CPU Adam takes them from a ``StateFeed`` the way it takes
gradients from a GradFeed: the chunks it will update, in order, are read into ``buffer_count``
host slots by one background thread, so the next chunks are read while one is updated; an
updated chunk goes to the model's parameters and is written back from its slot on the same
thread, in order, before the slot is read into again. Host memory for the states stays at
``buffer_count`` slots of one chunk each, whatever the model's size.

Plain ``os.pread``/``os.pwrite`` (no libaio): every file is written whole at start, so its space
is reserved then and a full disk refuses the start rather than a later step. The files are
opened at the start of each step, so a folder removed mid-run fails that step by name.

Glossary: a *kind* is one of the three per-group files (``master``, ``exp_avg``, ``exp_avg_sq``);
a *slot* holds one chunk of all three kinds.
"""
from __future__ import annotations

import contextlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import torch

from launcher.zero.errors import ConfigError, NvmeOffloadError

KINDS = ("master", "exp_avg", "exp_avg_sq")
MOMENTS = KINDS[1:]
_WRITE_PIECE = 1 << 24   # bytes per pwrite while filling a file at start (bounds the zero buffer)


def rank_folder(nvme_path: str, rank: int) -> str:
    return os.path.join(nvme_path, f"dslaunch-rank{rank}")


def check_folder(nvme_path: str, rank: int, section: str = "offload_optimizer") -> str:
    """This rank's folder under ``nvme_path`` (the key ``zero_optimization.<section>.nvme_path``),
    made and probed for writing before training."""
    hint = f"point {section}.nvme_path at an existing folder this user can write, on a local NVMe disk"
    if not os.path.isdir(nvme_path):
        raise ConfigError(f"zero_optimization.{section}.nvme_path {nvme_path!r} is not a folder", hint=hint)
    folder = rank_folder(nvme_path, rank)
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, ".probe")
        with open(probe, "wb") as handle:
            handle.write(b"x")
        os.remove(probe)
    except OSError as error:
        raise ConfigError(f"zero_optimization.{section}.nvme_path {nvme_path!r}: cannot write {folder} "
                          f"({error.strerror or error})", hint=hint) from None
    return folder


@contextlib.contextmanager
def io_guard(path: str, what: str, hint: str):
    """An OSError reading or writing ``path`` -> one NvmeOffloadError naming it, with ``hint``."""
    try:
        yield
    except NvmeOffloadError:
        raise
    except OSError as error:
        raise NvmeOffloadError(f"NVMe offload: cannot {what} {path} ({error.strerror or error})", hint=hint) from None


def _bytes_view(tensor: torch.Tensor):
    """A writable buffer over a contiguous CPU tensor's bytes (bf16 has no numpy dtype: viewed as uint8)."""
    return tensor.view(-1).view(torch.uint8).numpy()


class NvmeStates:
    """The files of every group's master and moments on this rank, and the feed that steps them."""

    def __init__(self, folder: str, chunk_numel: int, buffer_count: int):
        self.folder = folder
        self.chunk_numel = int(chunk_numel)
        self.buffer_count = int(buffer_count)
        self.groups: list[dict[str, tuple[str, torch.dtype, int]]] = []   # kind -> (path, dtype, numel)
        self.by_master: dict[int, int] = {}       # id(master placeholder) -> group position

    # ---- files ----------------------------------------------------------------------------
    def add_group(self, master: torch.Tensor, moment_dtype: torch.dtype) -> torch.Tensor:
        """Write ``master`` and zero moments to this group's files; return the placeholder the
        optimizer steps instead (the right shape and dtype, one element of memory)."""
        position = len(self.groups)
        files = {}
        for kind in KINDS:
            dtype = master.dtype if kind == "master" else moment_dtype
            files[kind] = (os.path.join(self.folder, f"group{position}.{kind}"), dtype, master.numel())
        self.groups.append(files)
        self.write_group(position, {"master": master.detach().view(-1)})
        placeholder = torch.zeros(1, dtype=master.dtype).expand(master.numel())
        self.by_master[id(placeholder)] = position
        return placeholder

    def disk_bytes(self) -> int:
        return sum(numel * dtype.itemsize for files in self.groups for _, dtype, numel in files.values())

    def write_group(self, position: int, values: dict[str, torch.Tensor | None]) -> None:
        """Whole files: the given kinds from ``values``, the others (None or absent) as zeros."""
        for kind, (path, dtype, numel) in self.groups[position].items():
            value = values.get(kind)
            with self._guard(path, "write"):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    if value is not None:
                        _pwrite_all(fd, _bytes_view(value.to(dtype).contiguous()), 0)
                    else:
                        zeros = bytearray(min(_WRITE_PIECE, numel * dtype.itemsize))
                        for offset in range(0, numel * dtype.itemsize, len(zeros)):
                            _pwrite_all(fd, memoryview(zeros)[: min(len(zeros), numel * dtype.itemsize - offset)],
                                        offset)
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def write_master(self, position: int, offset: int, values: torch.Tensor) -> None:
        """Elements ``offset...`` of one group's master (a parameter changed outside the step)."""
        path, dtype, _ = self.groups[position]["master"]
        with self._guard(path, "write"):
            fd = os.open(path, os.O_WRONLY)
            try:
                _pwrite_all(fd, _bytes_view(values.detach().to(device="cpu", dtype=dtype).contiguous()),
                            offset * dtype.itemsize)
            finally:
                os.close(fd)

    def read_group(self, position: int) -> dict[str, torch.Tensor]:
        """Whole tensors of one group (checkpoints: DeepSpeed swaps the states in to save them too)."""
        out = {}
        for kind, (path, dtype, numel) in self.groups[position].items():
            tensor = torch.empty(numel, dtype=dtype)
            with self._guard(path, "read"):
                fd = os.open(path, os.O_RDONLY)
                try:
                    _pread_all(fd, _bytes_view(tensor), 0, path)
                finally:
                    os.close(fd)
            out[kind] = tensor
        return out

    def _guard(self, path: str, what: str):
        return io_guard(path, what, f"keep {self.folder} in place with room for {self.disk_bytes()} bytes during "
                                    "training; resume from the last checkpoint (it holds the optimizer states)")

    # ---- the step -------------------------------------------------------------------------
    def feed(self, on_updated: Callable[[int, int, int, torch.Tensor], None]) -> "StateFeed":
        return StateFeed(self, on_updated)


class StateFeed:
    """Our CPU Adam's ``state_feed``: ``begin(spans)``, ``take(i)`` -> (master, exp_avg, exp_avg_sq)
    host views of chunk i, ``done(i)`` once updated, ``finish()`` once every chunk is."""

    def __init__(self, states: NvmeStates, on_updated):
        self.states = states
        self.on_updated = on_updated   # (group position, start, end, updated master chunk)
        self.slots: list[dict[str, torch.Tensor]] = []
        self._io = ThreadPoolExecutor(1, thread_name_prefix="dslaunch-nvme")
        self._spans: list = []
        self._reads: list[Future | None] = []
        self._writes: list[Future] = []
        self._fds: dict[str, int] = {}

    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for slot in self.slots for t in slot.values())

    def _slots_for(self, longest: int) -> None:
        states = self.states
        numel = min(states.chunk_numel, longest)
        if self.slots and self.slots[0]["master"].numel() >= numel:
            return
        files = states.groups[0]
        self.slots = [{kind: torch.empty(numel, dtype=files[kind][1]) for kind in KINDS}
                      for _ in range(states.buffer_count)]

    def begin(self, spans) -> None:
        self._spans = [(self.states.by_master[id(p)], a, b) for p, a, b in spans]
        self._reads, self._writes = [None] * len(spans), []
        if not spans:
            return
        self._slots_for(max(b - a for _, a, b in self._spans))
        self._fds = {}
        try:
            for position in sorted({g for g, _, _ in self._spans}):
                for kind, (path, _, _) in self.states.groups[position].items():
                    with self.states._guard(path, "open"):
                        self._fds[path] = os.open(path, os.O_RDWR)
        except NvmeOffloadError:
            self._close()
            raise
        for index in range(min(len(self.slots), len(spans))):
            self._reads[index] = self._io.submit(self._read, index)

    def take(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self._result(self._reads[index])
        _, a, b = self._spans[index]
        slot = self.slots[index % len(self.slots)]
        return tuple(slot[kind][: b - a] for kind in KINDS)

    def done(self, index: int) -> None:
        position, a, b = self._spans[index]
        self.on_updated(position, a, b, self.slots[index % len(self.slots)]["master"][: b - a])
        self._writes.append(self._io.submit(self._write, index))
        following = index + len(self.slots)
        if following < len(self._spans):   # queued after the write of the chunk whose slot it takes
            self._reads[following] = self._io.submit(self._read, following)

    def finish(self) -> None:
        try:
            for write in self._writes:
                self._result(write)
        finally:
            self._close()

    def abandon(self) -> None:
        """After an error in the step: wait for what was queued, drop its errors, close the files."""
        for future in [f for f in self._reads if f is not None] + self._writes:
            future.exception()
        self._close()

    def close(self) -> None:
        """The engine is destroyed: stop the I/O thread (the files stay for a later look)."""
        self._io.shutdown(wait=True)
        self._close()

    def _close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def _result(self, future: Future) -> None:
        future.result()

    def _io_args(self, index: int):
        position, a, b = self._spans[index]
        slot = self.slots[index % len(self.slots)]
        for kind, (path, dtype, _) in self.states.groups[position].items():
            yield path, _bytes_view(slot[kind][: b - a]), a * dtype.itemsize

    def _read(self, index: int) -> None:
        for path, buffer, offset in self._io_args(index):
            with self.states._guard(path, "read"):
                _pread_all(self._fds[path], buffer, offset, path)

    def _write(self, index: int) -> None:
        for path, buffer, offset in self._io_args(index):
            with self.states._guard(path, "write"):
                _pwrite_all(self._fds[path], buffer, offset)


def _pwrite_all(fd: int, buffer, offset: int) -> None:
    view = memoryview(buffer).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _pread_all(fd: int, buffer, offset: int, path: str) -> None:
    view = memoryview(buffer).cast("B")
    while view:
        count = os.preadv(fd, [view], offset)
        if count == 0:
            raise OSError(0, f"the file ends early (at byte {offset})", path)
        view, offset = view[count:], offset + count

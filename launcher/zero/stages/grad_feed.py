"""Gradients that stay on the device until the CPU Adam takes them, a chunk at a time.

Stage 3's optimizer offload used to copy every gradient into a host buffer as large as the
master (4 bytes a parameter, fp32) during backward. With a ``GradFeed`` the gradients stay in
the device's flat gradient buffer; as our CPU Adam runs through its chunks, each chunk's
gradient is cast to the masters' dtype (fp32, or bf16 with ``bf16_master_weights_and_grads``)
on the device and copied into one of a few pinned host slots just ahead of its update, so the
host holds the master and Adam's two moments and no gradient buffer (issue 32 item 4: host
bytes per parameter bound the largest model offload can train).

Glossary: a *span* is one chunk of the Adam, ``(master, start, end)``; a *slot* is a pinned host
buffer one chunk long; ``depth`` slots let the copies of the next chunks run during an update.
"""
from __future__ import annotations

import torch

from launcher.zero.stages.host_memory import host_zeros


class GradFeed:
    """Our CPU Adam's ``grad_feed``: ``begin(spans)``, then ``take(i)`` and ``done(i)`` in order."""

    def __init__(self, device: torch.device, chunk_numel: int, pin: bool, depth: int = 3,
                 dtype: torch.dtype = torch.float32):
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self.device = device
        self.stream = torch.cuda.Stream(device=device) if self.cuda else None
        #: the masters' dtype: fp32, or bf16 with bf16_master_weights_and_grads (cast on the device)
        self.slots = [host_zeros(chunk_numel, dtype, pin) for _ in range(depth)]
        self.sources: dict[int, torch.Tensor] = {}   # id(master) -> its flat gradient on the device
        self._ready = None      # the gradients' kernels are queued before this event
        self._spans: list = []
        self._events: list = []

    def use(self, masters: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """Each master's gradient is the device tensor at the same position."""
        self.sources = {id(master): grad for master, grad in zip(masters, grads)}

    def feeds(self, master: torch.Tensor) -> bool:
        """Whether ``master``'s gradient comes from here (a master on the device keeps its ``.grad``)."""
        return id(master) in self.sources

    def arm(self) -> None:
        """On the training thread once backward is queued: the copies wait for its kernels."""
        if self.cuda:
            self._ready = torch.cuda.Event()
            self._ready.record(torch.cuda.current_stream(self.device))

    def begin(self, spans: list[tuple[torch.Tensor, int, int]]) -> None:
        """The Adam's chunks in the order it will update them: start the first copies."""
        self._spans, self._events = list(spans), [None] * len(spans)
        for index in range(min(len(self.slots), len(spans))):
            self._copy(index)

    def take(self, index: int) -> torch.Tensor:
        """Chunk ``index``'s gradient in host memory (the slots' dtype), once its copy has landed."""
        event = self._events[index]
        if event is not None:
            event.synchronize()
        _, start, end = self._spans[index]
        return self.slots[index % len(self.slots)][: end - start]

    def done(self, index: int) -> None:
        """Chunk ``index`` is updated: its slot takes the copy of the chunk ``depth`` later."""
        following = index + len(self.slots)
        if following < len(self._spans):
            self._copy(following)

    def _copy(self, index: int) -> None:
        master, start, end = self._spans[index]
        source = self.sources[id(master)][start:end]
        slot = self.slots[index % len(self.slots)][: end - start]
        if self.stream is None:
            slot.copy_(source)
            return
        with torch.cuda.stream(self.stream):
            if self._ready is not None:
                self.stream.wait_event(self._ready)
            # cast on the device: the host's bandwidth is the Adam's (allocated on this stream)
            piece = source if source.dtype == slot.dtype else source.to(slot.dtype)
            slot.copy_(piece, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        self._events[index] = event

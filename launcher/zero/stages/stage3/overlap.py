"""``offload_optimizer.overlap_step`` at stage 3: the CPU Adam in the background, the forward
waiting per parameter.

As each chunk of a flat host master is updated (our CPU Adam's ``on_chunk``), the worker thread
copies the shards and persistent parameters that the chunk completes to the device (on a side
stream, cast there) and publishes the chunk's mark. A partitioned parameter waits for its mark
whenever it is gathered (the forward, ``zero.GatheredParameters``; a prefetch stops at the first
parameter not yet final instead of waiting), a parameter every rank holds whole when its module's
forward starts. The host gradients are two buffers used in turn, so
the next backward never writes the buffer the running step reads.
"""
from __future__ import annotations

import torch

from launcher.zero.stages.stage3 import params as P
from launcher.zero.stages.step_overlap import FirstUseOrder, StepOverlap


class Stage3StepOverlap:
    """Marks, hooks and uploads of one stage-3 strategy's background step."""

    def __init__(self, strategy, module: torch.nn.Module, optimizer):
        self.strategy = strategy
        self.overlap = StepOverlap(strategy.context.dist_context.device)
        self.needs: dict[int, tuple[int, int]] = {}
        for position, (params, slots) in enumerate(zip(strategy.group_params, strategy.group_slots)):
            for param, slot in zip(params, slots):
                self.needs[id(param)] = (position, slot.offset + slot.length)
        self.position_of = {id(master): position for position, master in enumerate(strategy.masters)}
        self.next_slot = [0] * len(strategy.masters)
        optimizer.on_chunk = self._chunk_updated
        if hasattr(optimizer, "chunk_priority"):
            order = {name: index for index, (name, _) in enumerate(module.named_parameters())}
            optimizer.chunk_priority = FirstUseOrder(
                strategy.masters, [[s.offset for s in slots] for slots in strategy.group_slots],
                [[order.get(s.name, 0) for s in slots] for slots in strategy.group_slots])
        self.partitioned = [p for params in strategy.group_params for p in params if P.is_partitioned(p)]
        for param in self.partitioned:   # every gather (forward, prefetch, GatheredParameters) waits
            param.ds_state.before_read = self._wait_for_one
        strategy.coordinator.ready = self.is_ready
        self.hooks = []
        for child in module.modules():
            own = [p for p in child.parameters(recurse=False) if id(p) in self.needs and not P.is_partitioned(p)]
            if own:
                self.hooks.append(child.register_forward_pre_hook(
                    lambda _module, _args, own=own: self.wait_for(own), prepend=True))

    def start(self, update) -> None:
        """Run ``update`` (the prepared CPU Adam step) and every upload in the worker thread."""
        self.next_slot = [0] * len(self.next_slot)

        def work():
            update()
            for position, slots in enumerate(self.strategy.group_slots):
                self._copy(position, len(slots), self.strategy.masters[position].numel())
        self.overlap.start(len(self.next_slot), work)

    def wait_for(self, params) -> None:
        """Block until each of ``params`` holds its updated values (a no-op with no step running)."""
        if not self.overlap.busy:
            return
        for p in params:
            need = self.needs.get(id(p))
            if need is not None:
                self.overlap.wait_for(*need)

    def _wait_for_one(self, param) -> None:
        if self.overlap.busy:
            self.overlap.wait_for(*self.needs[id(param)])

    def is_ready(self, param) -> bool:
        """Whether ``param``'s update is done: a prefetch does not wait for one that is not."""
        need = self.needs.get(id(param))
        return need is None or self.overlap.is_final(*need)

    def _chunk_updated(self, master: torch.Tensor, start: int, end: int) -> None:
        """Worker thread: master[:end] is final; upload the slots it completes and publish them."""
        position = self.position_of.get(id(master))
        if position is None:
            return
        slots = self.strategy.group_slots[position]
        last = self.next_slot[position]
        while last < len(slots) and slots[last].offset + slots[last].length <= end:
            last += 1
        self._copy(position, last, slots[last].offset if last < len(slots) else end)

    def _copy(self, position: int, last: int, mark: int) -> None:
        first, self.next_slot[position] = self.next_slot[position], max(last, self.next_slot[position])
        stream = self.overlap.stream
        if first < last:
            if stream is None:
                self.strategy.copy_slots(position, first, last)
            else:
                if self.strategy.masters[position].device.type == "cuda":   # updated on the device (ratio):
                    stream.wait_stream(torch.cuda.current_stream())          # the copies follow that update
                with torch.cuda.stream(stream):
                    self.strategy.copy_slots(position, first, last)
        self.overlap.publish(position, mark, stream)

    def remove(self) -> None:
        for handle in self.hooks:
            handle.remove()
        self.hooks = []
        self.strategy.coordinator.ready = None
        for param in self.partitioned:
            param.ds_state.before_read = None
        self.overlap.close()

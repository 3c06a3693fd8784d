"""When partitioned parameters are gathered and released during forward and backward.

Forward: a pre-hook on every module that owns partitioned parameters gathers them (and starts
the all-gathers of the next modules in the recorded order, up to ``stage3_prefetch_bucket_size``
elements and ``stage3_max_live_parameters`` live elements); a post-hook releases them unless
the same module runs again within ``stage3_max_reuse_distance`` elements.

Backward: autograd keeps references to the tensors it saved in forward. A saved-tensor hook
replaces every saved partitioned parameter (or view of one) by a small reference, so releasing
really frees the memory, and the unpack side gathers the parameter again right when the
backward of the op that used it runs. Releasing after backward is the strategy's gradient hook.

Access: a module may read a parameter of a child it never calls (``nn.MultiheadAttention``
uses ``out_proj.weight`` directly). Every module owning partitioned parameters gets a
``_parameters`` dict that gathers a released parameter when it is read while a forward runs;
the parameter then belongs to the innermost running module and is released after it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from launcher.zero.stages.stage3 import params as P


@dataclass(frozen=True)
class Stage3Options:
    """The stage-3 knobs of ``zero_optimization`` (DeepSpeed's names without the prefix)."""

    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    param_persistence_threshold: int = 100_000
    model_persistence_threshold: int = 2 ** 63 - 1


class _ParamRef:
    """What autograd stores instead of a partitioned parameter (or a view of its full buffer)."""

    __slots__ = ("param", "size", "stride", "offset")

    def __init__(self, param, size=None, stride=None, offset=None):
        self.param, self.size, self.stride, self.offset = param, size, stride, offset


class _GatheringParams(dict):
    """A module's ``_parameters`` that gathers a released partitioned parameter on read in forward."""

    def __init__(self, items, coordinator: "ParamCoordinator"):
        super().__init__(items)
        self.coordinator = coordinator

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        if value is not None and P.is_partitioned(value) and value.ds_state.status != P.AVAILABLE:
            self.coordinator.on_access(value)
        return value

    def __reduce__(self):  # copies and pickles of the module get a plain dict
        return (dict, (dict(self),))


def _own_partitioned(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters(recurse=False) if P.is_partitioned(p)]


class ParamCoordinator:
    """Installs the hooks on a module tree and keeps the order modules ran in."""

    def __init__(self, root: torch.nn.Module, options: Stage3Options):
        self.root = root
        self.options = options
        self.trace: list[torch.nn.Module] = []     # forward order, recorded on the first forward
        self.recorded = False
        self.position = 0
        self.live_numel = 0
        self._by_storage: dict[int, torch.nn.Parameter] = {}
        self._saved_hooks = None
        self._handles: list[Any] = []
        self._keep: set[int] = set()               # trace positions whose params stay gathered
        self._positions: dict[int, list[int]] = {}  # id(param) -> trace positions of its modules
        self.backward_position = 0
        self._frames: list[list[torch.nn.Parameter]] = []  # per running hooked module: params read by access
        self._in_forward = False
        #: whether a parameter may be gathered without waiting (prefetch stops at the first that may not)
        self.ready = None

    # ---- installation -----------------------------------------------------------------
    def install(self) -> None:
        for module in self.root.modules():
            if _own_partitioned(module):
                self._handles.append(module.register_forward_pre_hook(self._before_module))
                self._handles.append(module.register_forward_hook(self._after_module))
                module._parameters = _GatheringParams(module._parameters, self)
        self._handles.append(self.root.register_forward_pre_hook(self._before_root, prepend=True))
        self._handles.append(self.root.register_forward_hook(self._after_root, always_call=True))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module in self.root.modules():
            if isinstance(module._parameters, _GatheringParams):
                module._parameters = dict(module._parameters)

    def on_access(self, p) -> None:
        """A released parameter was read: gather it while a forward (or a recomputation) runs."""
        if not (self._in_forward or self._frames):
            return
        self.fetch([p])
        if self._frames:
            self._frames[-1].append(p)   # else the root's post-hook releases it with the rest

    # ---- gather / release with bookkeeping ------------------------------------------------
    def fetch(self, params, async_op: bool = False) -> None:
        for p in params:
            if p.ds_state.status == P.NOT_AVAILABLE:
                P.start_gather(p, async_op=async_op)
                self.live_numel += p.ds_state.numel
        if not async_op:
            for p in params:
                self._finish(p)

    def _finish(self, p) -> None:
        if p.ds_state.status == P.NOT_AVAILABLE:
            self.live_numel += p.ds_state.numel
        P.finish_gather(p)
        if p.ds_state.world_size > 1:   # at world size 1 the "buffer" is the shard itself, never freed
            self._by_storage[p.ds_state.buffer.untyped_storage().data_ptr()] = p

    def release(self, p) -> None:
        state = p.ds_state
        if state.status == P.NOT_AVAILABLE:
            P.release(p)      # drops a shape-only placeholder left by the gradient hook
            return
        if state.buffer is not None and state.world_size > 1:
            self._by_storage.pop(state.buffer.untyped_storage().data_ptr(), None)
        self.live_numel -= state.numel
        P.release(p)

    def release_all(self) -> None:
        for p in self.root.parameters():
            if P.is_partitioned(p):
                self.release(p)

    # ---- forward hooks ------------------------------------------------------------------
    def _before_root(self, module, args):
        self.position = 0
        self._running: list[int] = []
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_hooks.__enter__()
        self._in_forward = True

    def _after_root(self, module, args, output):
        self._in_forward = False
        self._frames.clear()
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        if not self.recorded and self.trace:
            self.recorded = True
            self._plan_reuse()
            for index, traced in enumerate(self.trace):
                for p in _own_partitioned(traced):
                    self._positions.setdefault(id(p), []).append(index)
        self.backward_position = len(self.trace)
        self.release_all()

    def _before_module(self, module, args):
        if not self.recorded:
            self.trace.append(module)
            self.position = len(self.trace) - 1
        else:
            self._advance_to(module)
            self._prefetch_after(self.position)
        self._running.append(self.position)
        self.fetch(_own_partitioned(module))
        self._frames.append([])

    def _after_module(self, module, args, output):
        for p in self._frames.pop() if self._frames else ():
            self.release(p)
        position = self._running.pop() if self._running else -1
        if self.recorded and position in self._keep:
            return
        for p in _own_partitioned(module):
            self.release(p)

    def _advance_to(self, module) -> None:
        """Find the module in the recorded order from the current position (a changed order just skips)."""
        for index in range(self.position, len(self.trace)):
            if self.trace[index] is module:
                self.position = index
                return

    def _prefetch_after(self, position: int) -> None:
        self._prefetch(self.trace[position + 1:])

    def _prefetch_before(self, param) -> None:
        """Backward runs the recorded order in reverse: fetch the modules before ``param``'s."""
        positions = [i for i in self._positions.get(id(param), ()) if i < self.backward_position]
        if not positions:
            return
        self.backward_position = positions[-1]
        self._prefetch(reversed(self.trace[:self.backward_position]))

    def _prefetch(self, modules) -> None:
        budget = self.options.prefetch_bucket_size
        for module in modules:
            if budget <= 0:
                break
            for p in _own_partitioned(module):
                if p.ds_state.status != P.NOT_AVAILABLE:
                    continue
                if self.live_numel + p.ds_state.numel > self.options.max_live_parameters:
                    return
                if self.ready is not None and not self.ready(p):
                    return
                self.fetch([p], async_op=True)
                budget -= p.ds_state.numel

    def _plan_reuse(self) -> None:
        """Trace positions after which a module's params stay, as it runs again within the reuse distance."""
        distance = self.options.max_reuse_distance
        for index, module in enumerate(self.trace):
            between = 0
            for later in self.trace[index + 1:]:
                if later is module:
                    if between <= distance:
                        self._keep.add(index)
                    break
                between += sum(p.ds_state.numel for p in _own_partitioned(later))

    # ---- saved tensors ------------------------------------------------------------------
    def _pack(self, tensor):
        if P.is_partitioned(tensor):
            return _ParamRef(tensor)
        if tensor.device.type == "meta" or not self._by_storage:
            return tensor
        param = self._by_storage.get(tensor.untyped_storage().data_ptr())
        if param is None:
            return tensor
        return _ParamRef(param, tensor.size(), tensor.stride(), tensor.storage_offset())

    def _unpack(self, saved):
        if not isinstance(saved, _ParamRef):
            return saved
        p = saved.param
        if self.recorded:
            self._prefetch_before(p)
        if p.ds_state.status != P.AVAILABLE:
            self.fetch([p])
        if saved.size is None:
            return p
        return p.data.as_strided(saved.size, saved.stride, saved.offset)

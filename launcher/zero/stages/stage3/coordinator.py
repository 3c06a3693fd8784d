"""When partitioned parameters are gathered and released during forward and backward.

Forward: a pre-hook on every module that owns partitioned parameters gathers them (and starts
the all-gathers of the next modules in the recorded order, up to ``stage3_prefetch_bucket_size``
elements and ``stage3_max_live_parameters`` live elements); a post-hook releases them unless
the same module runs again within ``stage3_max_reuse_distance`` elements.

Backward: autograd keeps references to the tensors it saved in forward. A saved-tensor hook
replaces every saved partitioned parameter (or view of one) by a small reference, so releasing
really frees the memory, and the unpack side gathers the parameter again right when the
backward of the op that used it runs. Releasing after backward is the strategy's gradient hook.

A parameter read outside every hooked module (TRL's fused LM head takes ``lm_head.weight`` at the
model's top level and hands it to its own autograd Function, which reads ``ds_status`` in backward)
is saved without these hooks: PyTorch hands a hook-unpacked tensor back as a new plain tensor
without the parameter's attributes, so the hooks are lifted from that read until the next hooked
module starts, and what is gathered at the end of such a forward stays gathered for backward (each
is released by its gradient hook or at the end of backward). A custom Function there gets the
parameter itself back, gathered, as under DeepSpeed. One called inside a hooked module still gets
a plain tensor.

Access: a module may read a parameter of a child it never calls (``nn.MultiheadAttention``
uses ``out_proj.weight`` directly), or return one of its parameters for its caller to use (a tied
output layer handed the embedding's weight): a parameter among a module's outputs stays gathered
and is released with the enclosing running module (DeepSpeed's automatic external parameters).
Every module owning partitioned parameters gets a ``_parameters`` dict that gathers a released
parameter when it is read while a forward runs; the parameter then belongs to the innermost running
module and is released after it.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

import torch

from launcher.zero.stages.stage3 import params as P

_AVAILABLE, _NOT_AVAILABLE = P.AVAILABLE, P.NOT_AVAILABLE


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
    """A module's ``_parameters`` that gathers a released partitioned parameter on read in forward.

    A change to the dict (a parameter assigned, deleted or replaced) tells the coordinator, whose
    cached per-module parameter tuples are then recomputed.
    """

    def __init__(self, items, coordinator: "ParamCoordinator"):
        super().__init__(items)
        self.coordinator = coordinator

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        state = getattr(value, "ds_state", None)      # None for a plain parameter (and for None)
        if state is not None and (state.status != _AVAILABLE or not self.coordinator._frames):
            self.coordinator.on_access(value)
        return value

    def __reduce__(self):  # copies and pickles of the module get a plain dict
        return (dict, (dict(self),))

    # ---- changes: the coordinator's caches of who owns which parameter are dropped ----------
    def __setitem__(self, key, value):
        dict.__setitem__(self, key, value)
        self.coordinator._parameters_changed()

    def __delitem__(self, key):
        dict.__delitem__(self, key)
        self.coordinator._parameters_changed()

    def __ior__(self, other):
        dict.update(self, other)
        self.coordinator._parameters_changed()
        return self

    def update(self, *args, **kwargs):
        dict.update(self, *args, **kwargs)
        self.coordinator._parameters_changed()

    def setdefault(self, key, default=None):
        value = dict.setdefault(self, key, default)
        self.coordinator._parameters_changed()
        return value

    def pop(self, *args):
        value = dict.pop(self, *args)
        self.coordinator._parameters_changed()
        return value

    def popitem(self):
        item = dict.popitem(self)
        self.coordinator._parameters_changed()
        return item

    def clear(self):
        dict.clear(self)
        self.coordinator._parameters_changed()


def _own_partitioned(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters(recurse=False) if P.is_partitioned(p)]


class ParamCoordinator:
    """Installs the hooks on a module tree and keeps the order modules ran in.

    Host cost: each hooked module's own partitioned parameters are computed once (``install``)
    into ``_own`` (dropped whenever a hooked module's ``_parameters`` changes); once the order is
    recorded, ``_at`` holds them per trace position. A prefetch resumes at a frontier instead of
    rescanning modules whose parameters are all gathered or inflight already: ``_frontier`` in
    forward (no module strictly between ``position`` and it has a released parameter) and
    ``_back_frontier`` in backward (the same strictly between it and ``backward_position``).
    ``release`` moves a frontier back to a module whose parameter it releases, and the frontiers
    reset at each root forward and where backward starts (the end of the root forward), so
    the same parameters are fetched at the same times as by a scan from the start.
    """

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
        #: offload_param nvme: starts reading the shards of the next module the prefetch left (nvme_params.py)
        self.read_ahead = None
        # host-cost caches, see the class docstring
        self._own: dict[int, tuple[torch.nn.Parameter, ...]] = {}    # id(module) -> own partitioned params
        self._at: list[tuple[torch.nn.Parameter, ...]] | None = None  # per trace position, once recorded
        self._where: dict[int, tuple[int, ...]] = {}   # id(param) -> the trace positions in _at holding it
        self._index_of: dict[int, list[int]] = {}      # id(module) -> its trace positions, once recorded
        self._frontier = 0
        self._back_frontier = 0
        self._units: list[torch.nn.Module] = []   # gathered whole, see use_units
        self.leaves: list[torch.nn.Module] = []   # the outermost leaf modules, see install
        self._lifted = False          # our saved-tensor hooks are off the stack (a top-level read)
        self._lifted_this_forward = False
        self._unit_ids: set[int] = set()
        self._rest = False            # the root gathers what is outside _units as one (use_units)
        self._saved_pair = (self._pack, self._unpack)   # the saved-tensor hooks (use_units: dynamo-proof)

    # ---- installation -----------------------------------------------------------------
    def install(self) -> None:
        # ZeRO-3 leaf modules (utils/z3_leaf_module.py) are gathered whole, as units are (outside
        # the units, a rest unit gathers them with the rest: use_units)
        explicit = {id(unit) for unit in self._units}
        within = {id(m) for unit in self._units for m in unit.modules()}
        leaves = [m for m in self.root.modules() if getattr(m, "_z3_leaf", False) and id(m) not in explicit
                  and (id(m) in within or not self._rest)]
        units = self._units + leaves
        self._unit_ids = {id(unit) for unit in units}
        inside = {id(m) for unit in units for m in unit.modules() if m is not unit}
        if self._rest:   # everything outside the units belongs to the root's unit
            inside |= {id(m) for m in self.root.modules() if m is not self.root and id(m) not in within}
        self.leaves = [leaf for leaf in leaves if id(leaf) not in inside]
        for leaf in self.leaves:
            for p in leaf.parameters():
                p.ds_z3_leaf_module = leaf
        gated = (torch.compiler.disable(self._before_module), torch.compiler.disable(self._after_module))
        for module in self.root.modules():
            if id(module) in inside:
                continue
            own = tuple(self._partitioned_of(module))
            if own:
                self._own[id(module)] = own
                before, after = gated if id(module) in explicit else (self._before_module, self._after_module)
                self._handles.append(module.register_forward_pre_hook(before))
                self._handles.append(module.register_forward_hook(after))
                if not (module is self.root and self._rest):   # the root's unit is gathered before any read
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
        """A partitioned parameter was read, released or outside every hooked module: gather it
        while a forward (or a recomputation) runs; a top-level read lifts the saved-tensor hooks."""
        if not (self._in_forward or self._frames):
            return
        if p.ds_state.status != _AVAILABLE:
            self.fetch([p])
            if self._frames:
                self._frames[-1].append(p)   # else the root's post-hook releases it with the rest
        if not self._frames and not self._lifted and torch.is_grad_enabled():
            self._lift_saved_hooks()

    def _lift_saved_hooks(self) -> None:
        """Take our saved-tensor hooks off the stack if they are on top (module docstring)."""
        top = torch._C._autograd._top_saved_tensors_default_hooks(True)
        if self._saved_hooks is None or top is None or top[0] != self._saved_pair[0]:
            return
        torch._C._autograd._pop_saved_tensors_default_hooks()
        self._lifted = self._lifted_this_forward = True

    def _restore_saved_hooks(self) -> None:
        torch._C._autograd._push_saved_tensors_default_hooks(*self._saved_pair)
        self._lifted = False

    # ---- caches ---------------------------------------------------------------------------
    def _own_params(self, module) -> tuple[torch.nn.Parameter, ...]:
        """``module``'s own partitioned parameters, from the cache (computed and kept on a miss)."""
        own = self._own.get(id(module))
        if own is None:
            own = self._own[id(module)] = tuple(self._partitioned_of(module))
        return own

    def _partitioned_of(self, module) -> list[torch.nn.Parameter]:
        """The partitioned parameters a module's hooks gather: its own, or a unit's whole tree's."""
        if module is self.root and self._rest:
            inside = {id(p) for unit in self._units for p in unit.parameters()}
            return list(dict.fromkeys(p for p in module.parameters() if P.is_partitioned(p) and id(p) not in inside))
        if id(module) in self._unit_ids:
            return list(dict.fromkeys(p for p in module.parameters() if P.is_partitioned(p)))
        return _own_partitioned(module)

    def use_units(self, units: list[torch.nn.Module], rest: bool = False) -> None:
        """Gather each of ``units`` as one module: the partitioned parameters of its whole tree
        before its forward, released after it, and no hooks (nor gathering ``_parameters``) inside
        it, where compiled code would trace them (compiling.py); its hooks (and the saved-tensor
        hooks) under ``torch.compiler.disable``: a graph calling a unit breaks there. ``rest``: the
        root is one more unit, of the partitioned parameters outside ``units``, and no other module
        has hooks. The recorded order starts again with the next forward."""
        self.remove()
        self._units, self._unit_ids = list(units), {id(unit) for unit in units}
        self._rest = rest
        # eager code under a compiled frame would have dynamo compile the pack hook as a frame
        self._saved_pair = (torch.compiler.disable(self._pack), torch.compiler.disable(self._unpack))
        self.trace, self.recorded, self.position = [], False, 0
        self._keep, self._positions, self._index_of = set(), {}, {}
        self._parameters_changed()
        self.install()

    def _parameters_changed(self) -> None:
        """A hooked module's parameters changed: recompute who owns what when next needed."""
        self._own.clear()
        self._at = None
        self._where = {}
        self._frontier, self._back_frontier = 0, len(self.trace)   # nothing known: scan in full

    def _trace_params(self) -> list[tuple[torch.nn.Parameter, ...]]:
        """Per trace position, that module's own partitioned parameters (and ``_where`` to match)."""
        if self._at is None:
            self._at = [self._own_params(module) for module in self.trace]
            where: dict[int, list[int]] = {}
            for index, own in enumerate(self._at):
                for p in own:
                    where.setdefault(id(p), []).append(index)
            self._where = {key: tuple(value) for key, value in where.items()}
        return self._at

    # ---- gather / release with bookkeeping ------------------------------------------------
    def fetch(self, params, async_op: bool = False) -> None:
        for p in params:
            state = p.ds_state
            if state.status == _NOT_AVAILABLE:
                P.start_gather(p, async_op=async_op)
                self.live_numel += state.numel
        if not async_op:
            for p in params:
                self._finish(p)

    def _finish(self, p) -> None:
        state = p.ds_state
        if state.status == _NOT_AVAILABLE:
            self.live_numel += state.numel
        P.finish_gather(p)
        if state.world_size > 1:   # at world size 1 the "buffer" is the shard itself, never freed
            self._by_storage[state.buffer.untyped_storage().data_ptr()] = p

    def release(self, p) -> None:
        state = p.ds_state
        if state.status == _NOT_AVAILABLE:
            # drops a shape-only placeholder left by the gradient hook; a parameter that already
            # holds what release leaves (1-D, empty, no storage, on its device) would get a new one
            if (p.numel() != 0 or p.dim() != 1 or p.device != state.device
                    or p.untyped_storage().nbytes() != 0):
                P.release(p)
            return
        if state.buffer is not None and state.world_size > 1:
            self._by_storage.pop(state.buffer.untyped_storage().data_ptr(), None)
        self.live_numel -= state.numel
        P.release(p)
        where = self._where.get(id(p))
        if where is not None:   # released: a prefetch has to look at its modules again
            for index in where:
                if self.position < index < self._frontier:
                    self._frontier = index
                if self._back_frontier < index < self.backward_position:
                    self._back_frontier = index

    def release_all(self) -> None:
        for p in self.root.parameters():
            if getattr(p, "ds_state", None) is not None:
                self.release(p)

    # ---- forward hooks ------------------------------------------------------------------
    def _before_root(self, module, args):
        self.position = 0
        self._frontier = 0
        self._running: list[int] = []
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(*self._saved_pair)
        self._saved_hooks.__enter__()
        self._lifted = self._lifted_this_forward = False
        self._frames.clear()   # a recomputation in the last backward may have left some
        self._in_forward = True

    def _after_root(self, module, args, output):
        self._in_forward = False
        self._frames.clear()
        if self._saved_hooks is not None:
            if not self._lifted:
                self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks, self._lifted = None, False
        if not self.recorded and self.trace:
            self.recorded = True
            self._plan_reuse()
            for index, own in enumerate(self._trace_params()):
                for p in own:
                    self._positions.setdefault(id(p), []).append(index)
            for index, traced in enumerate(self.trace):
                self._index_of.setdefault(id(traced), []).append(index)
        self.backward_position = len(self.trace)
        self._back_frontier = len(self.trace)
        if not self._lifted_this_forward:   # else saved unhooked: kept for backward (docstring)
            self.release_all()

    def _before_module(self, module, args):
        if self._lifted:
            self._restore_saved_hooks()
        if not self.recorded:
            self.trace.append(module)
            self.position = len(self.trace) - 1
        else:
            self._advance_to(module)
            if self.ready is not None:
                # readiness differs between ranks (each finishes its background step at its own
                # time): gathering the module's own parameters first keeps every rank's gathers in
                # trace order (prefetching the next module before this one's own not-yet-ready
                # parameter put them in another order on each rank: a collective mismatch)
                self.fetch(self._own_params(module))
            self._prefetch_after(self.position)
        self._running.append(self.position)
        self.fetch(self._own_params(module))
        self._frames.append([])

    def _after_module(self, module, args, output):
        # a parameter the module returns is used by whoever called it (DeepSpeed's "external
        # parameter"): gathered, it belongs to the enclosing running module now (or to the root)
        handed_on = P.returned_params(output)
        if handed_on:
            self.fetch(list(handed_on.values()))
        for p in self._frames.pop() if self._frames else ():
            if id(p) not in handed_on:
                self.release(p)
        if handed_on and self._frames:
            self._frames[-1].extend(handed_on.values())
        position = self._running.pop() if self._running else -1
        if self.recorded and position in self._keep:
            return
        for p in self._own_params(module):
            if id(p) not in handed_on:
                self.release(p)

    def _advance_to(self, module) -> None:
        """Find the module in the recorded order from the current position (a changed order just skips)."""
        indices = self._index_of.get(id(module))
        if indices is not None and indices[-1] >= self.position:
            self.position = indices[bisect_left(indices, self.position)]

    def _prefetch_after(self, position: int) -> None:
        """Forward: fetch the modules after ``position`` (from the first not known to be fetched)."""
        start = position + 1
        if self._frontier > start:
            start = self._frontier
        if start < len(self.trace):
            self._frontier = self._prefetch(start, len(self.trace), 1)
            if self.read_ahead is not None and self._frontier < len(self.trace):
                self.read_ahead(self._trace_params()[self._frontier])

    def _prefetch_before(self, param) -> None:
        """Backward runs the recorded order in reverse: fetch the modules before ``param``'s."""
        backward_position = self.backward_position
        for index in reversed(self._positions.get(id(param), ())):
            if index < backward_position:
                break
        else:
            return
        self.backward_position = index
        start = index - 1
        if self._back_frontier < start:
            start = self._back_frontier
        if start >= 0:
            self._back_frontier = self._prefetch(start, -1, -1)
            if self.read_ahead is not None and self._back_frontier >= 0:
                self.read_ahead(self._trace_params()[self._back_frontier])

    def _prefetch(self, start: int, stop: int, step: int) -> int:
        """Start the all-gathers of the released parameters of the modules at trace positions
        ``range(start, stop, step)`` in turn, until ``stage3_prefetch_bucket_size`` elements were
        started (checked between modules), or up to a parameter that would pass
        ``stage3_max_live_parameters`` or is not ``ready``. Returns the first position not
        examined in full (``stop`` when all were)."""
        at = self._trace_params()
        budget = self.options.prefetch_bucket_size
        max_live = self.options.max_live_parameters
        ready = self.ready
        for index in range(start, stop, step):
            if budget <= 0:
                return index
            for p in at[index]:
                state = p.ds_state
                if state.status != _NOT_AVAILABLE:
                    continue
                numel = state.numel
                if self.live_numel + numel > max_live:
                    return index
                if ready is not None and not ready(p):
                    return index
                P.start_gather(p, async_op=True)
                self.live_numel += numel
                budget -= numel
        return stop

    def _plan_reuse(self) -> None:
        """Trace positions after which a module's params stay, as it runs again within the reuse distance."""
        distance = self.options.max_reuse_distance
        numels = [sum(p.ds_state.numel for p in own) for own in self._trace_params()]
        for index, module in enumerate(self.trace):
            between = 0
            for later in range(index + 1, len(self.trace)):
                if self.trace[later] is module:
                    if between <= distance:
                        self._keep.add(index)
                    break
                between += numels[later]

    # ---- saved tensors ------------------------------------------------------------------
    def _pack(self, tensor):
        if getattr(tensor, "ds_state", None) is not None:
            return _ParamRef(tensor)
        by_storage = self._by_storage
        if not by_storage or tensor.device.type == "meta":
            return tensor
        param = by_storage.get(tensor.untyped_storage().data_ptr())
        if param is None:
            return tensor
        return _ParamRef(param, tensor.size(), tensor.stride(), tensor.storage_offset())

    def _unpack(self, saved):
        if type(saved) is not _ParamRef:
            return saved
        p = saved.param
        if self.recorded:
            self._prefetch_before(p)
        if p.ds_state.status != _AVAILABLE:
            self.fetch([p])
        if saved.size is None:
            return p
        return p.data.as_strided(saved.size, saved.stride, saved.offset)

"""``zero.Init``: build a model already partitioned; ``zero.GatheredParameters``: see it whole.

Init partitions a module's parameters as soon as the module's ``__init__`` has returned: torch's
public registration hooks report every new parameter and submodule, and at each such event the
parameters whose owning module is no longer under construction (no ``__init__`` frame of it on
the stack) are partitioned. So while a model is built no rank holds more than the modules under
construction plus its shards of everything finished before. Modules initialise
their parameters in their own ``__init__``/``reset_parameters`` exactly as without Init (same
values for the same seed); rank 0's values are broadcast so that all ranks agree. No torch
factory function is patched: a change a parent makes to an already assigned child's parameters
(``self.apply(init_fn)`` at the end of ``__init__``) sees partitioned parameters, so do such
surgery inside ``GatheredParameters(..., modifier_rank=0)``.
"""
from __future__ import annotations

from typing import Any, Iterable

import sys

import torch
import torch.distributed as dist
from torch.nn.modules import module as torch_module

from launcher.zero.config.load import load_config
from launcher.zero.distributed.collectives import broadcast_from
from launcher.zero.distributed.context import context_from_group, init_distributed
from launcher.zero.errors import ConfigError
from launcher.zero.failure import install_from_env
from launcher.zero.stages.stage3 import params as P

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _config_choices(config) -> tuple[torch.dtype | None, bool]:
    """(parameter dtype, shards on the CPU) from a config dict/path, or (None, False)."""
    if config is None:
        return None, False
    cfg = load_config(config, passed_to="zero.Init")
    dtype = torch.float16 if cfg.fp16.enabled else torch.bfloat16 if cfg.bf16.enabled else None
    offload = cfg.zero_optimization.offload_param
    return dtype, bool(offload is not None and offload.active)


class Init:
    """Context manager: modules created inside are partitioned over ``data_parallel_group``.

    ``remote_device="cpu"`` keeps the shards in host memory (``offload_param``); ``dtype`` casts
    the parameters as they are partitioned; ``config_dict_or_path`` supplies both from a config.
    ``module=`` partitions an already built module at once.
    """

    def __init__(self, module: torch.nn.Module | None = None, data_parallel_group: Any = None,
                 mem_efficient_linear: bool = True, remote_device: str | None = None, pin_memory: bool = False,
                 config_dict_or_path: Any = None, config: Any = None, enabled: bool = True,
                 dtype: torch.dtype | None = None, mpu: Any = None, device: torch.device | str | None = None):
        install_from_env()   # its config error is one message for the job, as initialize's
        if mpu is not None:
            raise ConfigError("zero.Init: model parallelism (mpu) is not supported", hint="remove mpu=")
        self.enabled = enabled
        config_dtype, config_offload = _config_choices(config_dict_or_path if config_dict_or_path is not None else config)
        self.dtype = dtype or config_dtype
        if remote_device not in (None, "none", "cpu", "cuda"):
            raise ConfigError(f"zero.Init: remote_device {remote_device!r} is not supported", hint="use 'cpu' or None")
        self.pin_memory = pin_memory
        self._group = data_parallel_group
        self._device = device
        self._shards_on_cpu = remote_device == "cpu" or config_offload
        self._handles: list[Any] = []
        self._pending: list[tuple[torch.nn.Module, torch.nn.Parameter]] = []
        if module is not None and enabled:
            self._start()
            self.partition_module(module)

    def _start(self) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            init_distributed()
        ctx = context_from_group(self._group, device=self._device)
        self.rank, self.world_size, self.device = ctx.rank, ctx.world_size, ctx.device
        self.group = ctx.group
        self.shard_device = torch.device("cpu") if self._shards_on_cpu else self.device

    # ---- the context --------------------------------------------------------------------
    def __enter__(self) -> "Init":
        if not self.enabled:
            return self
        self._start()
        self._handles = [
            torch_module.register_module_module_registration_hook(self._on_child),
            torch_module.register_module_parameter_registration_hook(self._on_parameter),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        pending, self._pending = self._pending, []
        if exc[0] is None:
            for _, p in pending:
                self._partition(p)

    def _on_child(self, parent, name, child):
        if child is not None:
            self.partition_module(child)
        self._sweep()
        return None

    def _on_parameter(self, module, name, param):
        self._sweep()
        if param is not None and not P.is_partitioned(param):
            self._pending.append((module, param))
        return None

    def _sweep(self) -> None:
        """Partition the pending parameters of modules whose ``__init__`` has returned."""
        if not self._pending:
            return
        building = _modules_under_construction()
        keep = []
        for owner, p in self._pending:
            if id(owner) in building:
                keep.append((owner, p))
            else:
                self._partition(p)
        self._pending = keep

    # ---- partitioning -------------------------------------------------------------------
    def partition_module(self, module: torch.nn.Module) -> None:
        """Partition every parameter of ``module`` that is not partitioned yet."""
        for p in module.parameters():
            self._partition(p)

    def _partition(self, p: torch.nn.Parameter) -> None:
        if P.is_partitioned(p) or p.device.type == "meta":
            return
        with torch.no_grad():
            data = p.data.to(self.device)
            if self.dtype is not None and data.is_floating_point():
                data = data.to(self.dtype)
            if self.world_size > 1:
                broadcast_from(data, group=self.group)
            p.data = data
            P.partition(p, self.group, self.rank, self.world_size, self.device, shard_device=self.shard_device)
            if self.pin_memory and self.shard_device.type == "cpu" and torch.cuda.is_available():
                p.ds_state.shard = p.ds_tensor = p.ds_state.shard.pin_memory()


def _modules_under_construction() -> set[int]:
    """ids of the modules whose ``__init__`` is running somewhere up the call stack."""
    building = set()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module):
                building.add(id(owner))
        frame = frame.f_back
    return building


def _as_list(params) -> list[torch.nn.Parameter]:
    if params is None:
        return []
    if isinstance(params, torch.Tensor):
        return [params]
    return list(params)


class GatheredParameters:
    """Context manager: the given (partitioned) parameters are whole inside; collective.

    With ``modifier_rank=r`` the values rank r holds on exit are broadcast and re-partitioned,
    so a change made there (initialisation, surgery, loading) reaches every rank and, inside a
    training engine, the fp32 master weights too. ``fwd_module`` is accepted for compatibility.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter] | torch.nn.Parameter, modifier_rank: int | None = None,
                 fwd_module: Any = None, enabled: bool = True):
        self.params = _as_list(params)
        self.modifier_rank = modifier_rank
        self.enabled = enabled
        self._gathered: list[torch.nn.Parameter] = []

    def __enter__(self):
        if not self.enabled:
            return self
        partitioned = [p for p in self.params if P.is_partitioned(p)]
        self._gathered = [p for p in partitioned if p.ds_state.status != P.AVAILABLE]
        P.gather(self._gathered)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if not self.enabled:
            return
        try:
            if exc_type is None and self.modifier_rank is not None:
                self._publish()
        finally:
            for p in self._gathered:
                P.release(p)
            self._gathered = []

    def _publish(self) -> None:
        with torch.no_grad():
            for p in self.params:
                group = p.ds_state.group if P.is_partitioned(p) else None
                if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
                    broadcast_from(p.data, self.modifier_rank, group)
                if P.is_partitioned(p):
                    P.update_shard_from_full(p, p.data)
                elif getattr(p, "ds_after_modify", None) is not None:
                    p.ds_after_modify(p)


# DeepSpeed's Init wraps torch's tensor constructors with this (transformers swaps it, inside
# prevent_arange_dtype_change, to keep torch.arange's dtype). This Init patches no constructor: the
# wrapper is here so that such code runs, and it is never called.
def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype=None, target_device=None):
    """The constructor unchanged (see the comment above)."""
    return fn


_orig_torch_arange = torch.arange


# DeepSpeed needs these to gather a parameter another module reads during forward; at stage 3 this
# engine gathers a partitioned parameter whenever any module reads it, so there is nothing to do.
def register_external_parameter(module, parameter) -> None:
    """No-op (see the comment above)."""


def unregister_external_parameter(module, parameter) -> None:
    """No-op (see the comment above)."""

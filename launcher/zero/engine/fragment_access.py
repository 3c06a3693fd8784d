"""DeepSpeed's tensor-fragment API (``deepspeed.utils.safe_get_full_fp32_param`` and its family):
one parameter's fp32 master or optimizer state, whole or this rank's part, read or written.

Every trained parameter carries a weak reference to its engine (``register``); the engine's
strategy lists where each parameter's elements live on this rank (``fragments()``: the same map
checkpoints are written from). A full read fills the elements this rank holds and takes the
maximum over the data-parallel ranks of a tensor that is -inf elsewhere: a partitioned element is
held by one rank, a replicated one holds the same value on each, so the result is exact either way.

As DeepSpeed's: a write changes the master (or the state) only; the model's weights follow at the
next optimizer step. A parameter no engine trains (frozen, or no engine) reads as None.

The gradient functions read and write the reduced gradient the next step will use, laid out as the
master is (``strategy.grad_of(fragment)``): meaningful after the backward of a gradient-accumulation
boundary and before ``step`` (earlier, stages 0-2 hold this rank's unreduced part). As in DeepSpeed it
is the gradient averaged over the data-parallel ranks, still multiplied by the fp16 loss scale.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from launcher.zero.errors import EngineUsageError

_ENGINE_ATTRIBUTE = "_zero_engine"
GRAD = object()   # a ``state_key`` meaning the gradient


def register(engine) -> None:
    """Let ``engine``'s trainable parameters find it (a weak reference: the engine may go away)."""
    reference = weakref.ref(engine)
    for param in engine.module.parameters():
        if param.requires_grad:
            setattr(param, _ENGINE_ATTRIBUTE, reference)


def _engine_of(param):
    reference = getattr(param, _ENGINE_ATTRIBUTE, None)
    engine = reference() if reference is not None else None
    if engine is None or engine.optimizer is None:
        return None
    engine.wait_for_step()   # a background step (overlap_step) may still be writing the masters
    return engine


def _name_of(engine, param) -> str:
    return next(n for n, p in engine.module.named_parameters() if p is param)


def _fragments(engine, param) -> list:
    name = _name_of(engine, param)
    return [f for f in engine.strategy.fragments() if f.name == name]


def _source(engine, fragment, state_key):
    """The tensor a fragment lives in: the master, or its optimizer state under ``state_key``."""
    if state_key is None:
        return fragment.master
    if state_key is GRAD:
        return engine.strategy.grad_of(fragment)
    return engine.basic_optimizer.state[fragment.master][state_key]


def get_full(param, state_key: str | None = None) -> torch.Tensor | None:
    """The whole fp32 master (or optimizer state) of ``param``, on the device; collective."""
    engine = _engine_of(param)
    if engine is None:
        return param.grad if state_key is GRAD else None
    fragments = _fragments(engine, param)
    shape = tuple(engine.strategy.full_shapes().get(_name_of(engine, param), param.shape))
    full = torch.full((int(torch.Size(shape).numel()),), float("-inf"), dtype=torch.float32,
                      device=engine.dist_context.device)
    for fragment in fragments:
        source = _source(engine, fragment, state_key).view(-1)
        piece = source[fragment.master_offset:fragment.master_offset + fragment.numel]
        full[fragment.param_start:fragment.param_start + fragment.numel] = piece.to(full.device, torch.float32)
    if engine.parallel_layout.size("data") > 1:
        dist.all_reduce(full, op=dist.ReduceOp.MAX, group=engine.parallel_layout.group("data"))
    return full.view(shape)


def set_full(param, value: torch.Tensor, state_key: str | None = None) -> None:
    """Write the part of ``value`` (the whole parameter's shape) that this rank holds."""
    engine = _engine_of(param)
    if engine is None:
        if state_key is GRAD and param.grad is not None:
            param.grad.copy_(value)
        return
    flat = value.detach().reshape(-1)
    for fragment in _fragments(engine, param):
        target = _source(engine, fragment, state_key).view(-1)[fragment.master_offset:
                                                               fragment.master_offset + fragment.numel]
        with torch.no_grad():
            target.copy_(flat[fragment.param_start:fragment.param_start + fragment.numel])


def get_local(param, state_key: str | None = None) -> torch.Tensor:
    """ZeRO-3: this rank's partition of the fp32 master (or state), 1-D (empty where it holds none);
    a view, so writing into it writes the master. DeepSpeed asserts on any other parameter."""
    engine = _engine_of(param)
    if engine is None or engine.zero_config.zero_stage != 3:
        raise EngineUsageError("This API is only defined for ZeRO-3 partitioned parameters",
                               hint="safe_get_full_fp32_param / safe_get_full_optimizer_state read a whole "
                                    "value at any stage")
    fragments = _fragments(engine, param)
    if not fragments:
        return torch.empty(0, dtype=torch.float32, device=engine.dist_context.device)
    fragment = fragments[0]
    source = _source(engine, fragment, state_key).view(-1)
    return source[fragment.master_offset:fragment.master_offset + fragment.numel]


def set_local(param, value: torch.Tensor, state_key: str | None = None) -> None:
    """ZeRO-3: overwrite this rank's partition (``value`` has its length)."""
    target = get_local(param, state_key)
    with torch.no_grad():
        target.copy_(value.detach().reshape(-1))


# ---- DeepSpeed's names (deepspeed.utils.tensor_fragment) ---------------------------------------
def safe_get_full_fp32_param(param):
    return get_full(param)


def safe_set_full_fp32_param(param, value):
    set_full(param, value)


def safe_get_full_optimizer_state(param, optim_state_key):
    return get_full(param, optim_state_key)


def safe_set_full_optimizer_state(param, value, optim_state_key):
    set_full(param, value, optim_state_key)


def safe_get_local_fp32_param(param):
    return get_local(param)


def safe_set_local_fp32_param(param, value):
    set_local(param, value)


def safe_get_local_optimizer_state(param, optim_state_key):
    return get_local(param, optim_state_key)


def safe_set_local_optimizer_state(param, value, optim_state_key):
    set_local(param, value, optim_state_key)


def safe_get_full_grad(param):
    return get_full(param, GRAD)


def safe_set_full_grad(param, value):
    set_full(param, value, GRAD)


def safe_get_local_grad(param):
    return get_local(param, GRAD)


def safe_set_local_grad(param, value):
    set_local(param, value, GRAD)


def safe_update_full_grad_vectorized(param_list, update_func):
    """``update_func(full_grad, param)`` gives each parameter's new full gradient; collective."""
    for param in param_list:
        if not param.requires_grad:
            continue
        current = get_full(param, GRAD)
        if current is not None:
            set_full(param, update_func(current, param), GRAD)

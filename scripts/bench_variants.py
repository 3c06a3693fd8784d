"""How each benchmark variant turns the GPT into a training step (runs inside one worker).

A variant is a function (model, settings) -> step, where step(idx, targets) runs one full
training step (forward, backward, clip, optimizer) and returns the loss tensor; given
``mark``, the step calls mark("forward"), mark("backward") and mark("step") as each phase
is queued (bench_worker.py times the phases with them). A variant that cannot run here
raises Unavailable with the reason. ``*_compile`` variants run torch.compile
(``settings.compile_backend``): whole model for plain, DeepSpeed and our stages 0-2, per
transformer block (torchtitan's way) for FSDP2, per block and the forward around them for our
stage 3 (launcher/zero/engine/compiling.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Callable

import torch
import torch.distributed as dist

Step = Callable[..., torch.Tensor]   # step(idx, targets, mark=None) -> loss

# Issue 7's targets: minimum tokens/s ratio to plain PyTorch, per variant.
TARGETS = {"zero0": 0.97, "zero1": 0.97, "zero2": 0.97, "zero3": 0.97, "zero2_offload": 0.60,
           "zero3_offload": 0.50, "zero2_offload_overlap": 0.60, "zero3_offload_overlap": 0.50}


BF16_STATES = {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}


class Unavailable(Exception):
    """The variant cannot run in this environment (missing package or engine feature)."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every variant shares: batch, optimizer hyper-parameters, clipping."""

    batch: int
    device: torch.device
    lr: float = 3e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    compile_backend: str = "inductor"   # the *_compile variants' torch.compile backend


def _adamw(params, settings: Settings) -> torch.optim.Optimizer:
    kwargs = dict(lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):  # fused not supported for these tensors
        return torch.optim.AdamW(params, foreach=True, **kwargs)


def _autocast(settings: Settings):
    return torch.autocast(device_type=settings.device.type, dtype=torch.bfloat16)


def _no_mark(phase: str) -> None:
    pass


def plain(model: torch.nn.Module, settings: Settings) -> Step:
    """Plain PyTorch: fp32 weights, autocast bf16, fused AdamW, clip by global norm."""
    return _torch_step(model, _adamw(model.parameters(), settings), settings, autocast=True)


def plain_fp32(model: torch.nn.Module, settings: Settings) -> Step:
    """Plain PyTorch in fp32 throughout (no autocast): the reference where bf16 noise must not enter."""
    return _torch_step(model, _adamw(model.parameters(), settings), settings, autocast=False)


def plain_fp32_nudged(model: torch.nn.Module, settings: Settings) -> Step:
    """plain_fp32 with the loss times (1 + 2**-20) before backward: every gradient moved by about
    1e-6 of itself, below what Adam and clipping (both scale-free) pass on except through
    rounding. How far it drifts from plain_fp32 is how far fp32 runs of the model drift by
    themselves (issue 39: MoE routing amplifies last-bit differences)."""
    return _torch_step(model, _adamw(model.parameters(), settings), settings, autocast=False, nudge=2.0 ** -20)


def plain_nudged(model: torch.nn.Module, settings: Settings) -> Step:
    """plain (bf16 autocast) with plain_fp32_nudged's nudge: bf16's self-drift."""
    return _torch_step(model, _adamw(model.parameters(), settings), settings, autocast=True, nudge=2.0 ** -20)


def plain_compile(model: torch.nn.Module, settings: Settings) -> Step:
    """Plain PyTorch with ``torch.compile(model)`` (the whole model, one graph where it can)."""
    compiled = torch.compile(model, backend=settings.compile_backend)
    return _torch_step(compiled, _adamw(model.parameters(), settings), settings, autocast=True,
                       params=list(model.parameters()))


def _torch_step(model: torch.nn.Module, optimizer, settings: Settings, autocast: bool, params=None,
                nudge: float = 0.0) -> Step:
    """forward (under autocast when asked), backward (of the loss times 1 + ``nudge``), clip by
    global norm, optimizer step."""
    params = list(model.parameters()) if params is None else params

    def step(idx, targets, mark=_no_mark):
        with _autocast(settings) if autocast else contextlib.nullcontext():
            loss = model(idx, targets)
        mark("forward")
        (loss * (1.0 + nudge) if nudge else loss).backward()
        mark("backward")
        if settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mark("step")
        return loss

    return step


def _init_process_group(device: torch.device) -> None:
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)


def blocks_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks (the repeated children of a ModuleList)."""
    from launcher.zero.engine.compiling import repeated_blocks

    return repeated_blocks(model)


def fsdp2(model: torch.nn.Module, settings: Settings, compile_blocks: bool = False) -> Step:
    """FSDP2 (fully_shard per block, then the root), bf16 compute and fp32 reduction; with
    ``compile_blocks`` each block's forward is compiled inside its FSDP hooks (torchtitan)."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError as exc:
            raise Unavailable(f"FSDP2 not in torch {torch.__version__}: {exc}") from None
    _init_process_group(settings.device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in blocks_of(model):
        fully_shard(block, mp_policy=policy)
        if compile_blocks:
            block.forward = torch.compile(block.forward, backend=settings.compile_backend)
    fully_shard(model, mp_policy=policy)
    return _torch_step(model, _adamw(model.parameters(), settings), settings, autocast=False)


def fsdp2_compile(model: torch.nn.Module, settings: Settings) -> Step:
    return fsdp2(model, settings, compile_blocks=True)


RATIO_SUB_GROUP = 25_000_000   # elements per rank: the 406M GPT in about 16 sub-groups, a 1/16 cut


def bench_nvme_folder() -> str:
    """The folder NVMe offload's files go to: $DSLAUNCH_BENCH_NVME, default /tmp/dslaunch-bench-nvme (made here)."""
    folder = os.environ.get("DSLAUNCH_BENCH_NVME", "/tmp/dslaunch-bench-nvme")
    os.makedirs(folder, exist_ok=True)
    return folder


def engine_config(stage: int, offload: bool, settings: Settings, overlap: bool = False,
                  offload_param: bool = False, fp32: bool = False, bf16_states: bool = False,
                  nvme: bool = False, ratio: float = 1.0, param_nvme: bool = False) -> dict:
    """The DeepSpeed-style config both our engine and DeepSpeed get for a stage
    (``overlap``: ours only, the offloaded step in the background, ``overlap_step``;
    ``offload_param``: stage 3's parameters in host memory too; ``fp32``: bf16 off;
    ``bf16_states``: bf16 master weights, gradients and Adam moments, DeepSpeed 0.19.8's two keys;
    ``nvme``: the optimizer states in files under $DSLAUNCH_BENCH_NVME, default /tmp/dslaunch-bench-nvme;
    ``ratio`` below 1: ``offload_optimizer.ratio``, the first 1 - ratio of DeepSpeed's sub-groups stepped on
    the device, with ``sub_group_size`` RATIO_SUB_GROUP so that the 406M GPT has sub-groups to split;
    ``param_nvme``: stage 3's parameter shards in a file under the same folder, ``offload_param.device`` nvme)."""
    zero: dict = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if nvme:
            zero["offload_optimizer"].update(device="nvme", nvme_path=bench_nvme_folder())
        if overlap:
            zero["offload_optimizer"]["overlap_step"] = True
        if ratio < 1.0:
            zero["offload_optimizer"]["ratio"] = ratio
            zero["sub_group_size"] = RATIO_SUB_GROUP
    if offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        if param_nvme:
            zero["offload_param"].update(device="nvme", nvme_path=bench_nvme_folder())
    return {
        "train_micro_batch_size_per_gpu": settings.batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": settings.grad_clip,
        "bf16": {"enabled": not fp32, **(BF16_STATES if bf16_states else {})},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {
            "lr": settings.lr, "betas": list(settings.betas), "eps": 1e-8,
            "weight_decay": settings.weight_decay}},
        "steps_per_print": 10**9,
    }


def _engine_step(engine) -> Step:
    def step(idx, targets, mark=_no_mark):
        loss = engine(idx, targets)
        mark("forward")
        engine.backward(loss)
        mark("backward")
        engine.step()
        mark("step")
        return loss

    step.engine = engine   # for the worker's byte accounting and compile statistics
    return step


def compile_config(settings: Settings) -> dict:
    """Our engine's ``compile`` section for the ``zero*_compile`` variants (DeepSpeed 0.19.8 has no
    ``enabled`` key: its variants call ``engine.compile()``)."""
    return {"enabled": True, "backend": settings.compile_backend, "kwargs": {}}


def torch_pinned_host_buffers() -> None:
    """In this worker process only: offload's large host buffers come from torch's caching pinned
    allocator (cudaHostAlloc, blocks rounded up to a power of two), as on 6d3c329, instead of
    exact-size mapped pages locked with cudaHostRegister (stages/host_memory.py, since a00dc26).
    The A/B of issue 43 item 1: the same step with either kind of page-locked memory."""
    from launcher.zero.stages import host_memory

    host_memory.EXACT_FROM_BYTES = float("inf")   # no size reaches it: every buffer takes torch's path


def ours(stage: int, offload: bool = False, overlap: bool = False, compiled: bool = False,
         offload_param: bool = False, fp32: bool = False, trace: bool | None = None, torch_pinned: bool = False,
         bf16_states: bool = False, nvme: bool = False, ratio: float = 1.0, param_nvme: bool = False):
    """Our engine, launcher.zero, at a stage (with optimizer offload to CPU if asked; compiled:
    the whole module at stages 0-2, per block and the top at stage 3; fp32: bf16 off; trace True/False: the inf/NaN
    trace, ``non_finite.trace`` (off by default), on/off; torch_pinned: see torch_pinned_host_buffers;
    bf16_states, nvme: see engine_config)."""

    def build(model: torch.nn.Module, settings: Settings) -> Step:
        try:
            from launcher import zero
        except ImportError as exc:
            raise Unavailable(f"launcher.zero not importable: {exc}") from None
        if torch_pinned:
            torch_pinned_host_buffers()
        try:
            zero.initialize  # noqa: B018 - lazy attribute: imports the engine
        except (ImportError, AttributeError) as exc:
            raise Unavailable(f"launcher.zero.initialize not importable: {exc}") from None
        config = engine_config(stage, offload, settings, overlap, offload_param, fp32, bf16_states, nvme, ratio,
                               param_nvme)
        if compiled:   # the engine's own path: zero.initialize compiles (engine.compile)
            config["compile"] = compile_config(settings)
        if trace is not None:
            config["non_finite"] = {"trace": trace}
        try:
            engine, _, _, _ = zero.initialize(model=model, config=config)
        except (ImportError, NotImplementedError) as exc:
            raise Unavailable(f"stage {stage}{' offload' if offload else ''}: "
                              f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:  # our typed errors: a stage or option not built yet
            if type(exc).__module__.startswith("launcher"):
                raise Unavailable(f"stage {stage}{' offload' if offload else ''}: "
                                  f"{type(exc).__name__}: {exc}") from None
            raise
        if compiled and not engine.is_compiled:
            raise RuntimeError("the compile section did not compile the engine")
        return _engine_step(engine)

    return build


def deepspeed(stage: int, offload: bool = False, compiled: bool = False, offload_param: bool = False,
              fp32: bool = False, bf16_states: bool = False, ratio: float = 1.0):
    """DeepSpeed (when installed) on the same config; FusedAdam / DeepSpeedCPUAdam; compiled:
    DeepSpeed 0.19.8's ``engine.compile(backend=...)`` (the whole module); ``ratio``: its
    ``offload_optimizer.ratio`` (stage 3 only in 0.19.8)."""

    def build(model: torch.nn.Module, settings: Settings) -> Step:
        if settings.device.type != "cuda":
            # On CPU DeepSpeed JIT-compiles its CPU ops first, minutes on a small machine.
            raise Unavailable("DeepSpeed variants run on CUDA only")
        try:
            import deepspeed as ds
        except ImportError as exc:
            raise Unavailable(f"deepspeed not installed: {exc}") from None
        ds.init_distributed(dist_backend="nccl" if settings.device.type == "cuda" else "gloo")
        params = list(model.parameters())
        from deepspeed.moe.utils import has_moe_layers, split_params_into_different_moe_groups_for_optimizer

        if has_moe_layers(model)[0]:   # DeepSpeed's ZeRO wants the expert parameters in their own groups
            params = split_params_into_different_moe_groups_for_optimizer({"params": params, "name": "params"})
        engine, _, _, _ = ds.initialize(model=model, model_parameters=params,
                                        config=engine_config(stage, offload, settings, offload_param=offload_param,
                                                              fp32=fp32, bf16_states=bf16_states, ratio=ratio))
        if compiled:
            engine.compile(backend=settings.compile_backend, compile_kwargs={})
        return _engine_step(engine)

    return build


VARIANTS: dict[str, Callable[[torch.nn.Module, Settings], Step]] = {
    "plain": plain,
    "plain_compile": plain_compile,
    "plain_fp32": plain_fp32,
    "plain_fp32_nudged": plain_fp32_nudged,
    "plain_nudged": plain_nudged,
    "fsdp2": fsdp2,
    "fsdp2_compile": fsdp2_compile,
    **{f"zero{s}": ours(s) for s in range(4)},
    "zero2_offload": ours(2, offload=True),
    "zero3_offload": ours(3, offload=True),
    "zero3_offload_all": ours(3, offload=True, offload_param=True),
    "zero2_offload_overlap": ours(2, offload=True, overlap=True),
    "zero3_offload_overlap": ours(3, offload=True, overlap=True),
    # the same with torch's pinned allocator for the host buffers (issue 43 item 1's A/B)
    "zero2_offload_overlap_torch_pinned": ours(2, offload=True, overlap=True, torch_pinned=True),
    "zero3_offload_overlap_torch_pinned": ours(3, offload=True, overlap=True, torch_pinned=True),
    # bf16 masters, gradients and Adam moments (issue 43 item 3), beside DeepSpeed's with the same keys
    **{f"zero{s}_offload{o}_bf16states": ours(s, offload=True, overlap=bool(o), bf16_states=True)
       for s in (2, 3) for o in ("", "_overlap")},
    **{f"ds_zero{s}_offload_bf16states": deepspeed(s, offload=True, bf16_states=True) for s in (2, 3)},
    # ZeRO-Infinity's optimizer states on NVMe (issue 43 item 4; stage 3 only, as in DeepSpeed)
    "zero3_offload_nvme": ours(3, offload=True, nvme=True),
    "zero3_offload_nvme_bf16states": ours(3, offload=True, nvme=True, bf16_states=True),
    # ... and the parameters' shards in a file too (offload_param.device nvme), the optimizer on the CPU or on NVMe
    "zero3_offload_all_pnvme": ours(3, offload=True, offload_param=True, param_nvme=True),
    "zero3_offload_all_nvme": ours(3, offload=True, offload_param=True, param_nvme=True, nvme=True),
    # offload_optimizer.ratio (issue 43 item 2): half of the optimizer states and their step kept on the GPU
    "zero3_offload_ratio50": ours(3, offload=True, ratio=0.5),
    "zero3_offload_overlap_ratio50": ours(3, offload=True, overlap=True, ratio=0.5),
    # the same at stage 2 (dslaunch's own: DeepSpeed 0.19.8 refuses ratio below 1 there), each rank's partition cut
    "zero2_offload_ratio50": ours(2, offload=True, ratio=0.5),
    "zero2_offload_overlap_ratio50": ours(2, offload=True, overlap=True, ratio=0.5),
    # the ratio swept, with and without bf16 states: zero{2,3}_offload[_overlap][_bf16states]_ratio{10..90}
    **{f"zero{s}_offload{o}{b}_ratio{r}": ours(s, offload=True, overlap=bool(o), bf16_states=bool(b), ratio=r / 100)
       for s in (2, 3) for o in ("", "_overlap") for b in ("", "_bf16states") for r in range(10, 100, 5)},
    **{f"ds_zero{s}": deepspeed(s) for s in range(4)},
    "ds_zero2_offload": deepspeed(2, offload=True),
    "ds_zero3_offload": deepspeed(3, offload=True),
    "ds_zero3_offload_all": deepspeed(3, offload=True, offload_param=True),
    # DeepSpeed's own partial offload beside ours (zero3_offload[_overlap]_ratio{r}'s twin)
    **{f"ds_zero3_offload{b}_ratio{r}": deepspeed(3, offload=True, bf16_states=bool(b), ratio=r / 100)
       for b in ("", "_bf16states") for r in range(10, 100, 5)},
    **{f"zero{s}_compile": ours(s, compiled=True) for s in range(4)},
    **{f"ds_zero{s}_compile": deepspeed(s, compiled=True) for s in range(4)},
    # fp32 throughout (issue 39: is MoE's bf16 gap to DeepSpeed routing noise or a real difference?)
    "zero2_fp32": ours(2, fp32=True),
    "ds_zero2_fp32": deepspeed(2, fp32=True),
    # the inf/NaN trace (non_finite.trace, off by default) on and off: --variants zero2_nantrace,zero2_nantrace_off
    # prints its cost
    **{f"zero{s}_nantrace": ours(s, trace=True) for s in range(4)},
    **{f"zero{s}_nantrace_off": ours(s, trace=False) for s in range(4)},
}

#: a variant with the inf/NaN trace off beside the same variant with it on (bench_report.add_trace_cost)
TRACE_OFF_TWIN = {name: name[:-len("_off")] for name in VARIANTS if name.endswith("_nantrace_off")}

#: each variant of ours beside the DeepSpeed variant of the same config (per-step losses)
DEEPSPEED_TWIN = {name: "ds_" + name.replace("_overlap", "") for name in VARIANTS
                  if not name.startswith("ds_") and "ds_" + name.replace("_overlap", "") in VARIANTS}

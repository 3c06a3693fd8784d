"""Write a checkpoint in DeepSpeed 0.19.8's layout, for a DeepSpeed job of a given world size, ZeRO
stage and precision: leaving this engine is as easy as coming (deepspeed_reader.py).

The input is a checkpoint in this engine's format (its metadata, model states and shards: read
from one of its folders, or from a DeepSpeed folder through DeepSpeedCheckpoint, which makes this
also a resharder of DeepSpeed checkpoints to another world size). Every parameter is gathered
whole in fp32 with its optimizer state, then cut as DeepSpeed cuts it (deepspeed_layout.py); the
files hold what DeepSpeed's load_checkpoint and zero_to_fp32.py read (engine.py,
stage_1_and_2.py and stage3.py ``state_dict``, fp16/fused_optimizer.py). DeepSpeed must run the
stage and precision written: its loader reads only its own stage's files.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

import torch

from launcher.zero.checkpoint import deepspeed_layout as layout
from launcher.zero.checkpoint.deepspeed_layout import DeepSpeedCheckpointError

# torch's values for the optimizer group keys that describe a device, safe on any machine
DEVICE_DEFAULTS = {"foreach": None, "fused": None, "capturable": False, "differentiable": False}


@dataclass(frozen=True)
class Target:
    """The DeepSpeed job that will load the checkpoint."""

    world_size: int
    stage: int
    dtype: torch.dtype          # torch.float32, torch.bfloat16 or torch.float16
    sub_group_size: int = 1_000_000_000     # stage 3's zero_optimization.sub_group_size


@dataclass
class Gathered:
    """A whole checkpoint in memory: each trainable parameter's fp32 value and optimizer state."""

    metadata: dict
    states: dict                            # this engine's model states
    groups: list[list[str]]                 # trainable parameter names of each optimizer group, in order
    fp32: dict[str, torch.Tensor]           # name -> flat fp32 value
    moments: dict[str, dict]                # name -> {key: flat tensor}
    scalars: list[dict]                     # per group: the scalar optimizer state (the step)
    shapes: dict[str, tuple]                # name -> full shape


def gather(metadata: dict, states: dict, shard) -> Gathered:
    """Every parameter whole from a checkpoint in this engine's format; ``shard(rank)`` reads one shard."""
    numels = {p["name"]: p["numel"] for p in metadata["params"]}
    fp32 = {name: torch.zeros(numel) for name, numel in numels.items()}
    moments: dict[str, dict] = {name: {} for name in numels}
    group_of: dict[str, int] = {}
    scalars: dict[int, dict] = {}
    for rank in range(len(metadata["ranks"])):
        for record in shard(rank)["fragments"]:
            name, start, numel = record["name"], record["param_start"], record["numel"]
            fp32[name][start:start + numel] = record["fp32"].float()
            for key, value in record["state"].items():
                moments[name].setdefault(key, torch.zeros(numels[name], dtype=value.dtype))[start:start + numel] = value
            group_of.setdefault(name, record["group"])
            scalars.setdefault(record["group"], dict(record["scalars"]))
    missing = [name for name in numels if name not in group_of]
    if missing:
        raise DeepSpeedCheckpointError(f"no shard holds parameter '{missing[0]}' ({len(missing)} missing)",
                                       hint="the checkpoint is incomplete")
    groups = [[name for name in numels if group_of[name] == g] for g in range(max(group_of.values()) + 1)]
    return Gathered(metadata, states, groups, fp32, moments, [scalars.get(g, {}) for g in range(len(groups))],
                    {p["name"]: tuple(p["shape"]) for p in metadata["params"]})


def write(gathered: Gathered, save_dir: str, tag: str, target: Target, save_latest: bool = True) -> str:
    """Write the DeepSpeed tag folder ``save_dir/tag`` (and ``latest``); returns its path."""
    if target.stage not in (0, 1, 2, 3) or target.world_size < 1:
        raise DeepSpeedCheckpointError(f"cannot write ZeRO stage {target.stage} for world size {target.world_size}",
                                       hint="pick a stage of 0-3 and a world size of at least 1")
    optimizer = (_config(gathered).get("optimizer") or {}).get("type", "")
    if str(optimizer).lower() == "muon":
        raise DeepSpeedCheckpointError(
            "optimizer Muon: its momentum cannot be written in DeepSpeed's layout (DeepSpeed's ZeRO 1-2 Muon keeps "
            "one momentum over the whole matrices a rank touches; its other stages are not recorded here)",
            hint="dslaunch-zero-to-fp32 gives the weights for DeepSpeed to load (Muon's momentum starts afresh)")
    path = os.path.join(save_dir, str(tag))
    os.makedirs(path, exist_ok=True)
    if target.stage == 3:
        for rank in range(target.world_size):
            layout.save(_model_states(gathered, target, rank), os.path.join(path, layout.zero_model_states_name(rank)))
    else:
        layout.save(_model_states(gathered, target, 0), os.path.join(path, layout.MODEL_STATES))
    if target.stage > 0:
        writer = _stage3_optim_states if target.stage == 3 else _stage12_optim_states
        for rank in range(target.world_size):
            name = layout.optim_states_name(rank, target.dtype == torch.bfloat16)
            saved = {"optimizer_state_dict": writer(gathered, target, rank),
                     "ds_config": _target_config(gathered, target), "ds_version": layout.DEEPSPEED_VERSION}
            layout.save(saved, os.path.join(path, name))
    if save_latest:
        with open(os.path.join(save_dir, "latest"), "w", encoding="utf-8") as handle:
            handle.write(str(tag))
    return path


# ---- model states -----------------------------------------------------------------------------------
def _model_states(gathered: Gathered, target: Target, rank: int) -> dict:
    """DeepSpeed's ``_common_checkpoint_state`` with the client state merged in (engine.py)."""
    states, metadata = gathered.states, gathered.metadata
    zero = target.stage > 0
    frozen = _frozen(gathered, target, rank) if target.stage >= 2 else None
    shapes = [OrderedDict((n, torch.Size(gathered.shapes[n])) for n in names) for names in gathered.groups]
    record = {"module": _module(gathered, target), "buffer_names": _buffer_names(gathered),
              "optimizer": None if zero else _stage0_optimizer(gathered, target),
              "param_shapes": shapes if zero else None,
              "frozen_param_shapes": OrderedDict((n, v.shape) for n, v in frozen[0].items()) if frozen else None,
              "shared_params": dict(metadata.get("shared_params") or {}) if zero else None,
              "frozen_param_fragments": frozen[1] if frozen else None,
              "lr_scheduler": states.get("lr_scheduler"), "data_sampler": None, "random_ltd": None,
              "skipped_steps": states.get("skipped_steps", 0), "global_steps": states["global_steps"],
              "global_samples": states.get("global_samples"), "dp_world_size": target.world_size,
              "mp_world_size": 1, "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
              "ds_config": _target_config(gathered, target), "ds_version": layout.DEEPSPEED_VERSION}
    # the client state sits beside DeepSpeed's keys; one read from a DeepSpeed folder holds those keys too
    record.update({k: v for k, v in (states.get("client_state") or {}).items() if k not in record})
    return record


def _module(gathered: Gathered, target: Target) -> dict:
    """The module state dict in the target precision; at stage 3 DeepSpeed's empty placeholders stand for parameters."""
    module = OrderedDict()
    trainable = {n for names in gathered.groups for n in names}
    for name, value in gathered.states["module"].items():
        if name in trainable:
            value = gathered.fp32[name].view(gathered.shapes[name]).to(target.dtype)
        elif value.is_floating_point() and name not in _buffer_names(gathered):
            value = value.to(target.dtype)
        if target.stage == 3 and name not in _buffer_names(gathered):
            value = torch.empty(0, dtype=value.dtype)
        module[name] = value
    return module


def _buffer_names(gathered: Gathered) -> list[str]:
    params = {p["name"] for p in gathered.metadata["params"]}
    params |= set(gathered.metadata.get("frozen_params") or ()) | set(gathered.metadata.get("shared_params") or ())
    return [name for name in gathered.states["module"] if name not in params]


def _frozen(gathered: Gathered, target: Target, rank: int) -> tuple[dict, dict] | None:
    """Frozen parameters whole, and what DeepSpeed keeps of them on ``rank`` (stage 3: its slice)."""
    names = gathered.metadata.get("frozen_params") or []
    module = gathered.states["module"]
    whole = OrderedDict((n, module[n].to(target.dtype)) for n in names if n in module)
    if target.stage < 3:
        return whole, OrderedDict((n, v.clone()) for n, v in whole.items())
    fragments = OrderedDict()
    for name, value in whole.items():
        share = -(-value.numel() // target.world_size)
        flat = torch.zeros(share * target.world_size, dtype=value.dtype)
        flat[:value.numel()] = value.view(-1)
        fragments[name] = flat[rank * share:(rank + 1) * share].clone()
    return whole, fragments


def _stage0_optimizer(gathered: Gathered, target: Target) -> dict:
    """Without ZeRO: the torch optimizer's state dict (fp32), or FP16_Optimizer's over flat groups."""
    groups = [_param_group(gathered, g, []) for g in range(len(gathered.groups))]
    if target.dtype == torch.float32:
        state, index = {}, 0
        for g, names in enumerate(gathered.groups):
            groups[g]["params"] = list(range(index, index + len(names)))
            for name in names:
                shape = gathered.shapes[name]
                state[index] = {**_step(gathered, g), **{k: v.view(shape) for k, v in gathered.moments[name].items()}}
                index += 1
        return {"state": state, "param_groups": groups}
    state = {}
    for g, names in enumerate(gathered.groups):
        groups[g]["params"] = [g]
        state[g] = {**_step(gathered, g), **_concat([gathered.moments[n] for n in names])}
    flats = [torch.cat([gathered.fp32[n] for n in names]) for names in gathered.groups]
    saved = {"optimizer_state_dict": {"state": state, "param_groups": groups}, "fp32_groups_flat": flats,
             "clip_grad": _clip(gathered)}
    if target.dtype == torch.float16:
        saved.update(_fp16_optimizer_scale(gathered))
    return saved


# ---- optimizer states of ZeRO -------------------------------------------------------------------------
def _stage12_optim_states(gathered: Gathered, target: Target, rank: int) -> dict:
    """stage_1_and_2.py's ``state_dict`` (rigid) for one rank."""
    partitions, paddings, states, mappings = [], [], {}, []
    for g, names in enumerate(gathered.groups):
        numels = [(n, gathered.fp32[n].numel()) for n in names]
        ranks, size = layout.stage12_pieces(numels, g, target.world_size)
        padding = min(max((rank + 1) * size - sum(n for _, n in numels), 0), size)
        fp32, moments = _partition(gathered, ranks[rank], size)
        partitions.append(fp32[:size - padding].clone())
        paddings.append(padding)
        states[g] = {**_step(gathered, g), **moments}
        mappings.append(OrderedDict((p.name, layout.deepspeed_object(layout.FRAGMENT_ADDRESS, numel=p.numel,
                                                                      start=p.offset)) for p in ranks[rank]))
    groups = [_param_group(gathered, g, [g]) for g in range(len(gathered.groups))]
    return {**_zero_scaler(gathered, target), "clip_grad": _clip(gathered),
            "base_optimizer_state": {"state": states, "param_groups": groups},
            "single_partition_of_fp32_groups": partitions,
            "zero_stage": layout.deepspeed_call(layout.ZERO_STAGE_ENUM, target.stage),
            "group_paddings": paddings, "param_alignment_paddings": [[0] * len(n) for n in gathered.groups],
            "partition_count": [target.world_size] * len(gathered.groups), "ds_version": layout.DEEPSPEED_VERSION,
            "param_slice_mappings": mappings}


def _stage3_optim_states(gathered: Gathered, target: Target, rank: int) -> dict:
    """stage3.py's ``_rigid_state_dict`` for one rank: a flat fp32 partition per sub-group."""
    flats, states, groups = [], {}, []
    for g, names in enumerate(gathered.groups):
        group_ids = []
        for sub_group in _sub_groups(names, gathered, target):
            params = [(n, g, gathered.fp32[n].numel()) for n in sub_group]
            pieces = layout.stage3_pieces(params, target.world_size)[rank]
            size = sum(-(-numel // target.world_size) for _, _, numel in params)
            fp32, moments = _partition(gathered, pieces, size)
            states[len(flats)] = {**_step(gathered, g), **moments}
            group_ids.append(len(flats))
            flats.append(fp32)
        groups.append(_param_group(gathered, g, group_ids))
    return {"zero_stage": layout.deepspeed_call(layout.ZERO_STAGE_ENUM, 3), **_zero_scaler(gathered, target),
            "partition_count": target.world_size,
            "optimizer_state_dict": {"state": states, "param_groups": groups}, "fp32_flat_groups": flats}


def _sub_groups(names: list[str], gathered: Gathered, target: Target) -> list[list[str]]:
    """stage3.py's ``_create_fp16_sub_groups``: parameters in order until a rank's share reaches sub_group_size."""
    shares = [-(-gathered.fp32[n].numel() // target.world_size) for n in names]
    if sum(shares) <= target.sub_group_size:
        return [list(names)]
    sub_groups, current, size = [], [], 0
    for name, share in zip(names, shares):
        current.append(name)
        size += share
        if size >= target.sub_group_size or name == names[-1]:
            sub_groups.append(current)
            current, size = [], 0
    return sub_groups


def _partition(gathered: Gathered, pieces: list, size: int) -> tuple[torch.Tensor, dict]:
    """One rank's flat fp32 partition and optimizer-state partitions (zero beyond the pieces: padding)."""
    fp32 = torch.zeros(size)
    moments: dict[str, torch.Tensor] = {}
    for piece in pieces:
        cut = slice(piece.param_start, piece.param_start + piece.numel)
        fp32[piece.offset:piece.offset + piece.numel] = gathered.fp32[piece.name][cut]
        for key, value in gathered.moments[piece.name].items():
            into = moments.setdefault(key, torch.zeros(size, dtype=value.dtype))
            into[piece.offset:piece.offset + piece.numel] = value[cut]
    return fp32, moments


# ---- small parts ---------------------------------------------------------------------------------------
def _param_group(gathered: Gathered, group: int, params: list) -> dict:
    """A param group both DeepSpeed's FusedAdam and torch's AdamW step with: the saved
    hyper-parameters, FusedAdam's ``bias_correction`` and ``step``, the device keys at torch's defaults."""
    saved = gathered.states.get("param_groups") or []
    values = dict(saved[group]) if group < len(saved) else {}
    values.update({key: value for key, value in DEVICE_DEFAULTS.items() if key in values})
    values.setdefault("bias_correction", True)
    values.update({"step": 0, "params": params})
    return values


def _step(gathered: Gathered, group: int) -> dict:
    """The scalar optimizer state as DeepSpeed's optimizers keep it (the step: an int)."""
    scalars = dict(gathered.scalars[group]) if group < len(gathered.scalars) else {}
    if "step" in scalars:
        scalars["step"] = int(float(scalars["step"]))
    return scalars


def _concat(per_param: list[dict]) -> dict:
    return {key: torch.cat([moments[key] for moments in per_param]) for key in (per_param[0] if per_param else {})}


def _zero_scaler(gathered: Gathered, target: Target) -> dict:
    """The loss scaler ZeRO pickles: static 1.0 unless fp16 (then the dynamic scaler's state)."""
    saved = ((gathered.states.get("loss_scaler") or {}).get("state")) or {}
    if target.dtype != torch.float16 or not saved:
        return {"loss_scaler": layout.deepspeed_object(layout.STATIC_SCALER, cur_scale=1.0, dynamic=False),
                "dynamic_loss_scale": False, "overflow": False}
    config = (_config(gathered).get("fp16") or {})
    hysteresis = int(config.get("hysteresis", 2))
    scaler = layout.deepspeed_object(
        layout.DYNAMIC_SCALER, cur_scale=float(saved["scale"]), dynamic=True, cur_iter=int(saved.get("iteration", 0)),
        last_overflow_iter=int(saved.get("last_overflow_iteration", -1)), scale_factor=2.0,
        scale_window=int(config.get("loss_scale_window", 1000)), min_scale=float(config.get("min_loss_scale", 1)),
        delayed_shift=hysteresis, cur_hysteresis=int(saved.get("hysteresis_left", hysteresis)),
        consecutive_hysteresis=bool(config.get("consecutive_hysteresis", False)), raise_error_at_min_scale=True,
        dtype=torch.float16)
    return {"loss_scaler": scaler, "dynamic_loss_scale": True, "overflow": False}


def _fp16_optimizer_scale(gathered: Gathered) -> dict:
    saved = ((gathered.states.get("loss_scaler") or {}).get("state")) or {"scale": 2.0 ** 16}
    config = (_config(gathered).get("fp16") or {})
    return {"dynamic_loss_scale": True, "cur_scale": float(saved["scale"]), "cur_iter": int(saved.get("iteration", 0)),
            "last_overflow_iter": int(saved.get("last_overflow_iteration", -1)), "scale_factor": 2.0,
            "scale_window": int(config.get("loss_scale_window", 1000))}


def _config(gathered: Gathered) -> dict:
    config = gathered.states.get("ds_config")
    return config if isinstance(config, dict) else {}


def _target_config(gathered: Gathered, target: Target) -> dict:
    """The saved config with the stage and precision written (what DeepSpeed's job should run)."""
    config = dict(_config(gathered))
    config["zero_optimization"] = {**(config.get("zero_optimization") or {}), "stage": target.stage}
    for section, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        config[section] = {**(config.get(section) or {}), "enabled": target.dtype == dtype}
    config.pop("bfloat16", None)
    return config


def _clip(gathered: Gathered) -> float:
    return float(_config(gathered).get("gradient_clipping", 0.0) or 0.0)


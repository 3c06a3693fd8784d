"""Pipeline checkpoints: one file per layer (and tensor rank), one optimizer file per stage.

    save_dir/latest
    save_dir/<tag>/metadata.json                              kind "pipeline": sizes, parts, ties
    save_dir/<tag>/layer_<ii>-model_<mm>-model_states.pt       a layer's fp32 tensors (+ partition dims)
    save_dir/<tag>/tied_<key>-model_<mm>-model_states.pt       a tied module, saved by its first stage
    save_dir/<tag>/optim_pipe_<ss>_model_<mm>.pt               optimizer, scheduler, counters
    save_dir/<tag>/digests.json                               size and sha256 of every file (digest.py)

Data rank 0 of each (stage, tensor) pair writes; at ZeRO stage 1 the data ranks' slices of the
optimizer state are gathered into it first (saved whole), so any data-parallel size loads it directly. Layer files are per global layer index, so another pipeline
size loads the weights too (the optimizer state needs the same stages); another tensor size goes
through ``dslaunch-zero-to-fp32``. Written under a temporary name and renamed, ``latest`` last.
Each rank digests the files it wrote; rank 0 gathers them into ``digests.json``. At load every rank
checks the files it reads against it (rank 0 also stats every listed file); a damaged tag reached
through ``latest`` gives way to the newest intact one, said once by rank 0; a damaged tag asked for
by name is a CheckpointDamagedError naming the file.
"""
from __future__ import annotations

import json
import os
import shutil

import sys

import torch
import torch.distributed as dist

from launcher.zero.checkpoint import digest
from launcher.zero.checkpoint import format as fmt
from launcher.zero.errors import CheckpointError


def layer_file(index: int, model_rank: int) -> str:
    return f"layer_{index:02d}-model_{model_rank:02d}-model_states.pt"


def tied_file(key: str, model_rank: int) -> str:
    return f"tied_{key}-model_{model_rank:02d}-model_states.pt"


def optim_file(stage: int, model_rank: int) -> str:
    return f"optim_pipe_{stage:02d}_model_{model_rank:02d}.pt"


def _tensors(module: torch.nn.Module, exclude_frozen_parameters: bool = False) -> dict:
    frozen = ({name for name, p in module.named_parameters() if not p.requires_grad} if exclude_frozen_parameters
              else set())
    state = {k: (v.detach().float().clone() if v.is_floating_point() else v.clone())
             for k, v in module.state_dict().items() if k not in frozen}
    dims = {name: p.partition_dim for name, p in module.named_parameters() if getattr(p, "tensor_model_parallel", False)}
    return {"state": state, "partition_dims": dims}


def _owned_files(engine, exclude_frozen_parameters: bool) -> dict[str, dict]:
    """The files this rank writes: its layers and tied modules (data rank 0 only), and its optimizer."""
    grid, module, files = engine.grid, engine.module, {}
    # ZeRO-1: every data rank gives its slice of the optimizer state (collective); data rank 0 writes it whole
    optimizer = (engine.shard.full_state(engine.optimizer) if engine.shard is not None
                 else engine.optimizer.state_dict())
    if grid.get_data_parallel_rank() != 0:
        return files
    model_rank = grid.get_model_parallel_rank()
    for index in module.stage_layers(engine.stage_id):
        layer = module._modules.get(str(index))
        if layer is not None:
            files[layer_file(index, model_rank)] = _tensors(layer, exclude_frozen_parameters)
    for key, stages in module.tied_stages().items():
        if stages[0] == engine.stage_id:
            files[tied_file(key, model_rank)] = _tensors(module.tied_modules[key], exclude_frozen_parameters)
    files[optim_file(engine.stage_id, model_rank)] = {
        "optimizer": optimizer,
        "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
        "loss_scaler": engine.loss_scaler.state_dict() if engine.loss_scaler is not None else None,
        "global_steps": engine.global_steps, "global_samples": engine.global_samples,
        "skipped_steps": engine.skipped_steps}
    return files


def save(engine, save_dir, tag=None, client_state=None, save_latest: bool = True,
         exclude_frozen_parameters: bool = False) -> str:
    """Collective: every rank writes its files into a temporary folder; rank 0 renames it into place
    and, with ``save_latest``, points ``latest`` at it."""
    save_dir = os.fspath(save_dir)
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    staging = os.path.join(save_dir, f".{tag}.tmp")
    if engine.global_rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
    dist.barrier()
    written = {}
    for name, payload in _owned_files(engine, exclude_frozen_parameters).items():
        torch.save(payload, os.path.join(staging, name))
        written[name] = digest.file_digest(os.path.join(staging, name))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, written)   # also the barrier: every rank's files are written
    if engine.global_rank == 0:
        topo = engine.grid.topology()
        metadata = {"format": fmt.FORMAT_VERSION, "kind": "pipeline", "tag": tag,
                    "pipe": engine.num_stages, "data": engine.grid.get_data_parallel_world_size(),
                    "tensor": engine.grid.get_model_parallel_world_size(), "parts": engine.module.parts,
                    "num_layers": len(engine.module._layer_specs), "tied": engine.module.tied_stages(),
                    "global_steps": engine.global_steps, "axes": topo.get_axis_names()}
        torch.save({"client_state": client_state or {}}, os.path.join(staging, "client_state.pt"))
        with open(os.path.join(staging, fmt.METADATA), "w", encoding="utf-8") as handle:
            json.dump(metadata, handle, indent=1)
        files = {name: entry for rank_files in every for name, entry in rank_files.items()}
        for name in ("client_state.pt", fmt.METADATA):
            files[name] = digest.file_digest(os.path.join(staging, name))
        digest.write_manifest(staging, files)   # the tag's last file, before the folder is published
        _replace(staging, os.path.join(save_dir, tag))
        if save_latest:
            latest = os.path.join(save_dir, f".{fmt.LATEST}.tmp")
            with open(latest, "w", encoding="utf-8") as handle:
                handle.write(tag)
            os.replace(latest, os.path.join(save_dir, fmt.LATEST))
    dist.barrier()
    return os.path.join(save_dir, tag)


def _replace(staging: str, final: str) -> None:
    old = final + ".old"
    if os.path.isdir(final):
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


def load(engine, load_dir, tag=None, load_module_strict: bool = True, load_optimizer_states: bool = True,
         load_lr_scheduler_states: bool = True, load_module_only: bool = False):
    """Load this rank's layers (any data size, any pipeline size); unless ``load_module_only``, the
    step counters, loss scale and (``load_lr_scheduler_states``) scheduler, and with
    ``load_optimizer_states`` (same stages only) the optimizer state."""
    load_dir = os.fspath(load_dir)
    resolved = fmt.resolve_tag(load_dir, tag)
    if resolved is None:
        return None, None
    path = _intact_tag(engine, load_dir, resolved, explicit=tag is not None)
    metadata = fmt.read_metadata(path)
    if metadata.get("kind") != "pipeline":
        raise CheckpointError(f"{path}: not a pipeline checkpoint", hint="consolidate it with dslaunch-zero-to-fp32 "
                              "and load the state dict into the PipelineModule's stages")
    model_rank, tensor = engine.grid.get_model_parallel_rank(), engine.grid.get_model_parallel_world_size()
    if metadata["tensor"] != tensor:
        raise CheckpointError(f"{path}: saved with tensor-parallel size {metadata['tensor']}, running with {tensor}",
                              hint="dslaunch-zero-to-fp32 gives the full state dict; shard it for the new size")
    module = engine.module
    for index in module.stage_layers(engine.stage_id):
        layer = module._modules.get(str(index))
        if layer is not None:
            layer.load_state_dict(_read(path, layer_file(index, model_rank))["state"], strict=load_module_strict)
    for key in module.tied_modules:
        module.tied_modules[key].load_state_dict(_read(path, tied_file(key, model_rank))["state"],
                                                 strict=load_module_strict)
    if engine.masters is not None:   # fp16/bf16: the masters restart from the saved (fp32) weights
        with torch.no_grad():
            for param, master in engine._holders():
                master.copy_(param.float())
    if engine.shard is not None:     # the optimizer's slice restarts from the loaded weights too
        engine.shard.refresh()
    if not load_module_only:
        _load_training_state(engine, path, metadata, model_rank, load_optimizer_states, load_lr_scheduler_states)
    client = _read(path, "client_state.pt")["client_state"]
    return path, client


def _load_training_state(engine, path: str, metadata: dict, model_rank: int, with_optimizer: bool,
                         with_scheduler: bool) -> None:
    same_stages = metadata["pipe"] == engine.num_stages and metadata["parts"] == engine.module.parts
    if with_optimizer and not same_stages:
        raise CheckpointError(f"{path}: optimizer states were saved for {metadata['pipe']} stages with parts "
                              f"{metadata['parts']}, this run has {engine.num_stages} with {engine.module.parts}",
                              hint="load_checkpoint(..., load_optimizer_states=False) loads the weights, the "
                                   "scheduler and the step counters without the optimizer state")
    # every stage's file holds the same scheduler and counters: another layout reads stage 0's
    state = _read(path, optim_file(engine.stage_id if same_stages else 0, model_rank))
    if with_optimizer:
        _load_optimizer(engine, path, state["optimizer"])
    if with_scheduler and engine.lr_scheduler is not None and state["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    if engine.loss_scaler is not None and state.get("loss_scaler") is not None:
        engine.loss_scaler.load_state_dict(state["loss_scaler"])
    engine.global_steps, engine.skipped_steps = state["global_steps"], state["skipped_steps"]
    # older checkpoints have no sample count: every step was a full train_batch
    engine.global_samples = state.get("global_samples", state["global_steps"] * engine.train_batch_size())


def _load_optimizer(engine, path: str, saved: dict) -> None:
    saved_sharded = isinstance(saved, dict) and saved.get("sharded_over_data", False)
    if saved_sharded != (engine.shard is not None):
        stages = ("1", "0") if saved_sharded else ("0", "1")
        raise CheckpointError(f"{path}: optimizer states were saved at ZeRO stage {stages[0]}, this run is at "
                              f"stage {stages[1]}", hint="run at the saved stage, or load_checkpoint(..., "
                              "load_optimizer_states=False) for all but the optimizer state")
    if engine.shard is not None:     # saved whole: this data rank takes its slice (any data size)
        engine.shard.load_full_state(engine.optimizer, saved)
    else:
        engine.optimizer.load_state_dict(saved)


def _read(path: str, name: str):
    """One file of the tag (load's _intact_tag checked it against its digest first)."""
    full = os.path.join(path, name)
    if not os.path.isfile(full):
        raise CheckpointError(f"{full}: missing", hint="the checkpoint is incomplete or from another model")
    return torch.load(full, map_location="cpu", weights_only=False)


def _intact_tag(engine, load_dir: str, tag: str, explicit: bool) -> str:
    """The tag asked for, else (from 'latest') the newest intact one. Every rank checks the files it
    will read (rank 0 also that every listed file is there at its size), then the ranks agree, so all
    of them load the same tag; one message for the job, from rank 0."""
    def agree(problem: str) -> list:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, problem)
        return every

    def check(path: str) -> str:
        _check_mine(engine, path)
        return path

    candidate, path, damaged = fmt.newest_intact(load_dir, tag, explicit, check, agree)
    if engine.global_rank == 0:
        _say_what_was_loaded(load_dir, candidate, path, damaged)
    return path


def _say_what_was_loaded(load_dir: str, tag: str, path: str, damaged: list) -> None:
    if damaged:
        skipped = "; ".join(f"'{t}' is damaged: {p}" for t, p in damaged)
        _warn(f"checkpoint in {load_dir}: {skipped}; loaded '{tag}', the newest intact checkpoint")
    if not os.path.isfile(os.path.join(path, digest.MANIFEST)):
        _warn(f"checkpoint {path} has no {digest.MANIFEST} (saved before checkpoints carried digests): loaded "
              "without verification")


def _warn(text: str) -> None:
    print(f"[zero] rank 0: warning: {text}", file=sys.stderr, flush=True)


def _check_mine(engine, path: str) -> None:
    """This rank's files of ``path`` against the manifest (none for a tag saved before digests)."""
    files = digest.read_manifest(path)
    if files is None:
        return
    if engine.global_rank == 0:
        digest.check_listing(path, files)
    model_rank = engine.grid.get_model_parallel_rank()
    mine = [layer_file(i, model_rank) for i in engine.module.stage_layers(engine.stage_id)]
    mine += [tied_file(key, model_rank) for key in engine.module.tied_modules]
    # its own stage's optimizer file, or stage 0's (another pipeline layout reads the counters there)
    mine += [optim_file(engine.stage_id, model_rank), optim_file(0, model_rank), "client_state.pt", fmt.METADATA]
    for name in mine:
        if name in files:
            digest.check_file(os.path.join(path, name), files[name])


def consolidate(path: str, metadata: dict) -> dict:
    """The full fp32 state dict (``<layer>.<param>``, ``tied_modules.<key>.<param>``): shards concatenated."""
    state = {}
    names = [(layer_file(i, 0), f"{i}.") for i in range(metadata["num_layers"])]
    names += [(tied_file(key, 0), f"tied_modules.{key}.") for key in metadata["tied"]]
    for first, prefix in names:
        if not os.path.isfile(os.path.join(path, first)):
            continue    # a layer without parameters
        shards = [_read(path, first.replace("-model_00-", f"-model_{m:02d}-")) for m in range(metadata["tensor"])]
        dims = shards[0]["partition_dims"]
        for key, value in shards[0]["state"].items():
            parts = [shard["state"][key] for shard in shards]
            state[prefix + key] = torch.cat(parts, dim=dims[key]) if key in dims else value
    return state

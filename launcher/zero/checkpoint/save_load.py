"""save_checkpoint / load_checkpoint: collective, crash-safe, and independent of the world size.

Save: every rank writes its shard into ``save_dir/.<tag>.partial``; after a barrier rank 0 adds
the metadata, renames the folder to ``<tag>`` and only then rewrites ``latest`` (by rename), so a
kill at any point leaves the previous checkpoint and ``latest`` intact (re-saving a tag moves the
old folder to ``.<tag>.old`` first, which a load of that tag falls back to). A write that fails
(a full disk) fails on every rank alike: a CheckpointError naming the folder, the bytes the
checkpoint needs and those free; the partial folder is removed, the last checkpoint untouched. Load: each rank reads
only the shards that overlap its own fragments (its own shard when nothing changed).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import shutil
import sys

import torch
import torch.distributed as dist

from launcher.zero.checkpoint import digest
from launcher.zero.checkpoint.writing import attempt, bytes_of, write_file
from launcher.zero.checkpoint import format as fmt
from launcher.zero.checkpoint.deepspeed_reader import is_deepspeed_checkpoint, read_deepspeed
from launcher.zero.errors import CheckpointError, CheckpointPathError
from launcher.zero.experts.wiring import every_expert_entry, global_expert_name

SCALAR = "scalars"


# ---- save ---------------------------------------------------------------------------------------
def save_checkpoint(engine, save_dir: str, tag=None, client_state: dict | None = None, save_latest: bool = True,
                    exclude_frozen_parameters: bool = False) -> bool:
    problem = _missing_folder("save_checkpoint", "save_dir", save_dir)
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    _check_tag_and_folder(engine, tag, problem)   # before anything is written; the same error on every rank
    save_dir = os.fspath(save_dir)
    rank, tensor = engine.dist_context.rank, engine.parallel_layout.tensor_parallel
    prefix = fmt.tensor_prefix(tensor.rank, tensor.size)
    lead = rank == 0 and tensor.rank == 0      # one rank of the whole job makes and publishes the folder
    partial = os.path.join(save_dir, f".{tag}.partial")
    problem = None
    if lead:
        shutil.rmtree(partial, ignore_errors=True)
        problem = attempt(save_dir, partial, 0, lambda: os.makedirs(partial))
    _agree_or_raise(engine, problem, partial, lead)
    fragments = _global_names(engine, engine.strategy.fragments())
    with engine.strategy.states_resident(write_back=False):
        shard = _shard(engine, fragments)
    written: dict[str, dict] = {}   # file name -> size and digest, of the files this rank wrote
    problem = attempt(save_dir, partial, bytes_of(shard),
                      lambda: write_file(partial, fmt.shard_name(rank, prefix), shard, written))
    listings = _all_gather_object(engine, [[f.name, f.param_start, f.numel] for f in fragments])
    module_state = engine.strategy.module_state_dict()  # collective at stage 3
    if exclude_frozen_parameters:
        frozen = {name for name, param in engine.module.named_parameters() if not param.requires_grad}
        module_state = {key: value for key, value in module_state.items() if key not in frozen}
    if rank == 0 and problem is None:       # data rank 0 of each tensor rank
        states = _model_states(engine, module_state, client_state or {})

        def write_states():
            write_file(partial, prefix + fmt.MODEL_STATES, states, written)
            write_file(partial, fmt.metadata_name(tensor.rank), _metadata(engine, listings), written)
        problem = attempt(save_dir, partial, bytes_of(states) + bytes_of(shard), write_states)
    files = _agree_or_raise(engine, problem, partial, lead, written)
    if lead:   # the digests last, then the folder; a full disk can still refuse them or 'latest'
        problem = attempt(save_dir, partial, len(tag), lambda: (digest.write_manifest(partial, files),
                                                                 _publish(save_dir, partial, tag, save_latest)))
    _agree_or_raise(engine, problem, partial, lead)
    return True


def _agree_or_raise(engine, problem: str | None, partial: str, lead: bool, written: dict | None = None) -> dict:
    """A barrier that also ends the save on every rank alike when any rank could not write; returns
    every rank's file digests (gathered with the problems: no extra collective)."""
    gathered = _all_gather_object(engine, [problem or "", written or {}], whole_job=True)
    problems = [p for p, _ in gathered if p]
    if not problems:
        return {name: entry for _, files in gathered for name, entry in files.items()}
    if lead:
        shutil.rmtree(partial, ignore_errors=True)   # the last complete checkpoint and `latest` stay as they are
    raise CheckpointError(problems[0], hint="free space there (or save elsewhere); the last complete checkpoint "
                                            "and 'latest' are unchanged")


def _shard(engine, fragments) -> dict:
    records = []
    for fragment in fragments:
        segment = slice(fragment.master_offset, fragment.master_offset + fragment.numel)
        state = engine.basic_optimizer.state.get(fragment.master, {})
        record = {"name": fragment.name, "group": fragment.group, "param_start": fragment.param_start,
                  "numel": fragment.numel, "fp32": fragment.master.detach().view(-1)[segment].float().cpu().clone(),
                  "state": {}, SCALAR: {}}
        for key, value in state.items():
            if torch.is_tensor(value) and value.numel() == fragment.master.numel() and value.dim() > 0:
                record["state"][key] = value.detach().view(-1)[segment].cpu().clone()
            else:
                record[SCALAR][key] = value.detach().cpu().clone() if torch.is_tensor(value) else value
        records.append(record)
    shard = {"format": fmt.FORMAT_VERSION, "rank": engine.dist_context.rank, "fragments": records, "rng": _rng_state()}
    extra = getattr(engine.basic_optimizer, "extra_state_dict", None)
    if extra is not None:  # per-rank optimizer state beyond the parameters (1-bit Adam's error buffers)
        shard["optimizer_extra"] = extra()
    return shard


def _model_states(engine, module_state, client_state) -> dict:
    groups = [{k: v for k, v in group.items() if k != "params"} for group in engine.basic_optimizer.param_groups]
    return {"module": module_state, "param_groups": groups,
            "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
            "loss_scaler": engine.loss_scaler.state_dict() if engine.loss_scaler is not None else None,
            "global_steps": engine.global_steps, "global_samples": engine.global_samples,
            "skipped_steps": engine.skipped_steps, "micro_steps": engine.micro_steps,
            "client_state": client_state, "ds_config": engine.config, "data_position": _data_position(engine)}


def _data_position(engine):
    """Where the engine's own loader stands in its pass (None without ``training_data``)."""
    position = getattr(engine.training_dataloader, "position", None)
    return position() if position is not None else None


def _metadata(engine, listings) -> dict:
    params, shared, frozen = [], {}, []
    canonical = {}
    for name, param in engine.module.named_parameters(remove_duplicate=False):
        if id(param) in canonical:
            shared[name] = canonical[id(param)]
            continue
        canonical[id(param)] = name
        if param.requires_grad:   # MoE: every global expert's entry (data rank 0 holds the first ones)
            params += every_expert_entry({"name": name, "shape": list(_full_shape(engine, name, param)),
                                          "numel": _numel(engine, name, param)}, engine.experts)
        else:
            frozen.append(name)
    metadata = {"format": fmt.FORMAT_VERSION, "world_size": engine.dist_context.world_size,
                "stage": engine.zero_config.zero_stage,
                "param_dtype": str(engine.precision.param_dtype), "global_steps": engine.global_steps,
                "params": params, "shared_params": shared, "frozen_params": frozen, "ranks": listings}
    tensor = engine.parallel_layout.tensor_parallel
    if tensor.size > 1:
        metadata["tensor_parallel"] = {"size": tensor.size, "rank": tensor.rank,
                                       "partition_dims": dict(tensor.partition_dims)}
    return metadata


def _full_shape(engine, name, param):
    shapes = engine.strategy.full_shapes()   # stage 3 knows the unpartitioned shape
    return tuple(shapes[name]) if name in shapes else tuple(param.shape)


def _numel(engine, name, param) -> int:
    count = 1
    for dim in _full_shape(engine, name, param):
        count *= dim
    return count


def _publish(save_dir: str, partial: str, tag: str, save_latest: bool) -> None:
    final = os.path.join(save_dir, tag)
    old = os.path.join(save_dir, f".{tag}.old")
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(final):
        os.replace(final, old)
    os.replace(partial, final)
    shutil.rmtree(old, ignore_errors=True)
    if save_latest:
        temporary = os.path.join(save_dir, f".{fmt.LATEST}.tmp")
        with open(temporary, "w", encoding="utf-8") as handle:
            handle.write(tag)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, os.path.join(save_dir, fmt.LATEST))


# ---- load ---------------------------------------------------------------------------------------
def load_checkpoint(engine, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                    load_lr_scheduler_states=True, load_module_only=False):
    if load_dir is None:   # "" is the working folder, as os.path.join makes it in DeepSpeed
        raise CheckpointPathError(_missing_folder("load_checkpoint", "load_dir", load_dir),
                                  hint="pass the folder save_checkpoint wrote, e.g. engine.load_checkpoint('checkpoints')")
    load_dir = os.fspath(load_dir)
    resolved = fmt.resolve_tag(load_dir, tag)
    if resolved is None:
        engine.monitor.warn(f"no 'latest' file in {load_dir}: nothing loaded (pass tag= to pick one)")
        return None, None
    if is_deepspeed_checkpoint(os.path.join(load_dir, resolved)):   # a DeepSpeed job switching over
        path = os.path.join(load_dir, resolved)
        _check_tensor_size(path, {}, engine.parallel_layout.size("tensor"))
        fragments = _global_names(engine, engine.strategy.fragments())
        metadata, states, shards = read_deepspeed(engine, path, fragments, functools.partial(_all_gather_object, engine))
        read = _TagRead(path, "", metadata, states, fragments, shards, verified=True)
    else:
        read = _read_intact(engine, load_dir, resolved, explicit=tag is not None)
    _check_params(engine, read.metadata, load_module_strict)
    with_optimizer = load_optimizer_states and not load_module_only
    with engine.strategy.states_resident(write_back=True):
        engine.strategy.load_module_state_dict(read.states["module"], strict=load_module_strict)
        _restore_fragments(engine, read.fragments, read.shards, with_optimizer)
        engine.strategy.sync_params_from_master()
    if not load_module_only:
        _restore_training_state(engine, read.path, read.states, read.metadata, read.shards, load_optimizer_states,
                                load_lr_scheduler_states, read.prefix)
    return read.path, read.states.get("client_state", {})


@dataclasses.dataclass
class _TagRead:
    """One tag's files this rank needs, read and checked before anything is restored."""
    path: str
    prefix: str
    metadata: dict
    states: dict
    fragments: list
    shards: dict
    verified: bool


def _read_intact(engine, load_dir: str, tag: str, explicit: bool) -> _TagRead:
    """The tag asked for, else (from 'latest') the newest intact one; every rank reads its files,
    then the ranks agree, so all of them restore the same tag. One message for the job, from rank 0."""
    candidate, read, damaged = fmt.newest_intact(
        load_dir, tag, explicit, functools.partial(_read_tag, engine),
        lambda problem: _all_gather_object(engine, problem, whole_job=True))
    _say_what_was_loaded(engine, load_dir, candidate, damaged, read)
    return read


def _say_what_was_loaded(engine, load_dir: str, tag: str, damaged: list, read: _TagRead) -> None:
    if engine.dist_context.rank != 0 or engine.parallel_layout.rank("tensor") != 0:
        return
    if damaged:
        skipped = "; ".join(f"'{t}' is damaged: {p}" for t, p in damaged)
        engine.monitor.warn(f"checkpoint in {load_dir}: {skipped}; loaded '{tag}', the newest intact checkpoint")
    if not read.verified:
        engine.monitor.warn(f"checkpoint {read.path} has no {digest.MANIFEST} (saved before checkpoints carried "
                            f"digests): loaded without verification")


def _read_tag(engine, path: str) -> _TagRead:
    """Every file of ``path`` this rank restores from, checked against the manifest (CheckpointDamagedError)."""
    files = digest.read_manifest(path)
    expected = files or {}
    tensor = engine.parallel_layout.tensor_parallel
    if files is not None and engine.dist_context.rank == 0 and tensor.rank == 0:
        digest.check_listing(path, files)   # a missing or cut file that no rank reads is still seen
    _check_tensor_size(path, fmt.read_metadata(path, expected=expected.get(fmt.METADATA)), tensor.size)
    prefix = fmt.tensor_prefix(tensor.rank, tensor.size)
    name = fmt.metadata_name(tensor.rank)
    metadata = fmt.read_metadata(path, name, expected=expected.get(name))
    states = fmt.load_file(os.path.join(path, prefix + fmt.MODEL_STATES), expected.get(prefix + fmt.MODEL_STATES))
    fragments = _global_names(engine, engine.strategy.fragments())
    wanted: dict[str, list] = {}
    for f in fragments:
        wanted.setdefault(f.name, []).append((f.param_start, f.param_start + f.numel))
    ranks = set(fmt.ranks_overlapping(metadata, wanted))
    if metadata["world_size"] == engine.dist_context.world_size:
        ranks.add(engine.dist_context.rank)   # its own shard: the RNG state and optimizer extras
    shards = {r: fmt.load_file(os.path.join(path, fmt.shard_name(r, prefix)), expected.get(fmt.shard_name(r, prefix)))
              for r in sorted(ranks)}
    return _TagRead(path, prefix, metadata, states, fragments, shards, verified=files is not None)


def _check_tensor_size(path: str, metadata: dict, size: int) -> None:
    saved = (metadata.get("tensor_parallel") or {}).get("size", 1)
    if saved != size:
        raise CheckpointError(f"{path}: saved with tensor-parallel size {saved}, running with {size}",
                              hint="dslaunch-zero-to-fp32 gives the full state dict; split it for the new size "
                                   "(apply_tensor_parallel) and load it into the model")


def _check_params(engine, metadata, strict: bool) -> None:
    saved = {p["name"]: tuple(p["shape"]) for p in metadata["params"]}
    current = {}
    for name, param in engine.module.named_parameters():
        if param.requires_grad:
            current[global_expert_name(name, engine.experts)] = _full_shape(engine, name, param)
    missing = sorted(set(current) - set(saved))
    wrong = sorted(n for n in set(current) & set(saved) if current[n] != saved[n])
    if wrong:
        name = wrong[0]
        raise CheckpointError(f"parameter '{name}' has shape {list(current[name])} but the checkpoint has {list(saved[name])}",
                              hint="load a checkpoint of the same model")
    if missing and strict:
        raise CheckpointError(f"the checkpoint has no parameter '{missing[0]}' ({len(missing)} missing)",
                              hint="load a checkpoint of the same model, or pass load_module_strict=False")


def _restore_fragments(engine, fragments, shards, with_optimizer: bool) -> None:
    saved_by_name: dict[str, list] = {}
    for shard in shards.values():
        for record in shard["fragments"]:
            saved_by_name.setdefault(record["name"], []).append(record)
    new_states: dict[int, dict] = {}
    masters = {}
    with torch.no_grad():
        for fragment in fragments:
            flat = fragment.master.view(-1)[fragment.master_offset:fragment.master_offset + fragment.numel]
            masters[id(fragment.master)] = fragment.master
            for record in saved_by_name.get(fragment.name, ()):
                fmt.copy_overlap(flat, fragment.param_start, record["fp32"].to(flat.dtype), record["param_start"])
                if not with_optimizer:
                    continue
                state = new_states.setdefault(id(fragment.master), {})
                group = engine.basic_optimizer.param_groups[fragment.group] if fragment.group < len(engine.basic_optimizer.param_groups) else {}
                # torch's policy: scalar state (the step count) stays on the CPU unless capturable or fused
                on_device = bool(group.get("capturable") or group.get("fused"))
                for key, value in record[SCALAR].items():
                    if torch.is_tensor(value) and on_device:
                        value = value.to(fragment.master.device)
                    state.setdefault(key, value)
                for key, value in record["state"].items():
                    if key not in state:
                        state[key] = torch.zeros(fragment.master.shape, dtype=_state_dtype(engine, fragment, value),
                                                 device=fragment.master.device)
                    target = state[key].view(-1)[fragment.master_offset:fragment.master_offset + fragment.numel]
                    fmt.copy_overlap(target, fragment.param_start, value, record["param_start"])
    if with_optimizer:
        for key, state in new_states.items():
            engine.basic_optimizer.state[masters[key]] = state


def _state_dtype(engine, fragment, saved: torch.Tensor) -> torch.dtype:
    """A restored state tensor's dtype: the saved one, but Adam's moments as the CPU Adam keeps them
    now (fp32, or bf16 with bf16_optimizer_states), whatever the run that saved them used."""
    moment_dtype = getattr(engine.basic_optimizer, "moment_dtype", None)
    return moment_dtype(fragment.master) if moment_dtype is not None and saved.is_floating_point() else saved.dtype


def _restore_training_state(engine, path, states, metadata, shards, load_optimizer_states,
                            load_lr_scheduler_states, prefix: str = "") -> None:
    if load_optimizer_states and len(states["param_groups"]) == len(engine.basic_optimizer.param_groups):
        for group, saved in zip(engine.basic_optimizer.param_groups, states["param_groups"]):
            group.update(saved)
    if load_lr_scheduler_states and engine.lr_scheduler is not None and states.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(states["lr_scheduler"])
    if engine.loss_scaler is not None and states.get("loss_scaler") is not None:
        engine.loss_scaler.load_state_dict(states["loss_scaler"])
    for key in ("global_steps", "global_samples", "skipped_steps", "micro_steps"):
        setattr(engine, key, states[key])
    if metadata["world_size"] != engine.dist_context.world_size:
        # another world size, the same train_batch_size: accumulation changed, so the micro-step count
        # restarts on this world's boundaries (checkpoints are taken on a boundary)
        engine.micro_steps = engine.global_steps * engine.gradient_accumulation_steps()
    loader = engine.training_dataloader
    if hasattr(loader, "resume") and states.get("data_position") is not None:
        loader.resume(states["data_position"])  # the engine's own loader continues the checkpointed pass
    # RNG streams are per rank (DeepSpeed saves none)
    if metadata["world_size"] == engine.dist_context.world_size and "deepspeed" not in metadata:
        rank = engine.dist_context.rank
        own = shards.get(rank) or fmt.load_file(os.path.join(path, fmt.shard_name(rank, prefix)))
        _set_rng_state(own["rng"])
        restore = getattr(engine.basic_optimizer, "load_extra_state_dict", None)
        if load_optimizer_states and restore is not None and own.get("optimizer_extra") is not None:
            restore(own["optimizer_extra"])


# ---- helpers --------------------------------------------------------------------------------------
def _global_names(engine, fragments) -> list:
    """MoE: fragments of expert parameters named by global expert id (one name per expert whichever
    rank holds it, so a checkpoint resumes at another world size and joins into one state dict)."""
    if not engine.experts:
        return fragments
    return [dataclasses.replace(f, name=global_expert_name(f.name, engine.experts)) for f in fragments]


def _rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if "numpy" in state and "numpy" in sys.modules:
        sys.modules["numpy"].random.set_state(state["numpy"])


def _barrier(engine) -> None:
    if engine.parallel_layout.size("data") > 1:
        dist.barrier(group=engine.parallel_layout.group("data"))


def job_barrier(engine) -> None:
    """Every rank of the job: under tensor parallelism the engine's group is one tensor rank's data ranks."""
    if engine.parallel_layout.size("tensor") > 1:
        dist.barrier()
    else:
        _barrier(engine)


def _all_gather_object(engine, value, whole_job: bool = False) -> list:
    """Every rank's JSON-able `value`, as JSON bytes in tensors (of the whole job with ``whole_job``:
    under tensor parallelism the engine's group is one tensor rank's data ranks).

    torch's all_gather_object needs numpy (an optional dependency of torch) to decode.
    """
    layout = engine.parallel_layout
    device, group, world = engine.dist_context.device, layout.group("data"), layout.size("data")
    if whole_job and engine.parallel_layout.size("tensor") > 1:
        group, world = None, dist.get_world_size()
    if world == 1:
        return [value]
    data = torch.tensor(list(json.dumps(value).encode()), dtype=torch.uint8, device=device)
    length = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length, group=group)
    longest = int(max(n.item() for n in lengths))
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[:data.numel()] = data
    chunks = [torch.zeros_like(padded) for _ in range(world)]
    dist.all_gather(chunks, padded, group=group)
    return [json.loads(bytes(chunk[:int(n.item())].tolist()).decode()) for chunk, n in zip(chunks, lengths)]


def _missing_folder(method: str, argument: str, folder) -> str | None:
    """The sentence for a folder argument that names no folder ("" or None), else None."""
    if folder is None or (isinstance(folder, str) and folder == ""):
        return f"{method}: {argument} must be a non-empty folder path, got {folder!r}"
    return None


def _check_tag_and_folder(engine, tag: str, folder_problem: str | None) -> None:
    """One exchange before the save writes anything: a rank without a folder (``save_dir`` "" or None)
    fails the save on every rank alike (a rank raising alone would leave the others waiting in the
    save's collectives), then the tag check (``checkpoint.tag_validation``)."""
    mode = engine.zero_config.checkpoint.tag_validation.lower()
    if engine.dist_context.world_size * engine.parallel_layout.size("tensor") == 1:
        entries = [[tag, folder_problem]]
    else:
        entries = _all_gather_object(engine, [tag, folder_problem], whole_job=True)
    problems = [(rank, problem) for rank, (_, problem) in enumerate(entries) if problem]
    if problems:
        rank, problem = problems[0]
        where = "" if len(entries) == 1 else f" (rank {rank}{' and others' if len(problems) > 1 else ''})"
        raise CheckpointPathError(problem + where, hint="pass the folder to save into, the same on every rank, e.g. "
                                                        "engine.save_checkpoint('checkpoints'); every rank must call it")
    tags = [entry_tag for entry_tag, _ in entries]
    if mode != "ignore" and len(set(tags)) > 1:
        text = f"checkpoint tag differs across ranks: {sorted(set(tags))}"
        if mode == "fail":
            raise CheckpointError(text, hint="pass the same tag on every rank")
        engine.monitor.warn(text)

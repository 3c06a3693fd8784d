"""The checkpoint layout on disk, and reading it back (shared by load_checkpoint and consolidation).

    save_dir/
      latest                    the newest complete tag (written last, by rename)
      <tag>/
        digests.json            size and sha256 of every file (written last; digest.py)
        metadata.json           world size, stage, dtypes, parameters, and which rank holds which
                                fragments (name, param_start, numel); with tensor parallelism also
                                the tensor size and each sharded parameter's partition dim
        model_states.pt         rank 0: module state dict, scheduler, loss scaler, counters, client state
        rank_<r>_shard.pt       rank r: its fragments (fp32 master values and optimizer-state slices), RNG

With tensor parallelism (``zero.initialize(mpu=)``) each tensor rank's files carry its prefix
(``model_01-rank_0_shard.pt``, ``model_01-model_states.pt``, ``model_01-metadata.json``; tensor
rank 0's metadata is ``metadata.json`` itself, the tag's marker); the data ranks of one tensor rank
form a plain checkpoint among themselves, so the data size may change at load.

A fragment is a contiguous slice of one flattened parameter; since every rank saves fragments
rather than its flat partition, a checkpoint loads at any world size and any stage.
"""
from __future__ import annotations

import json
import os
from typing import Any

from launcher.zero.checkpoint import digest
from launcher.zero.errors import CheckpointDamagedError, CheckpointError

FORMAT_VERSION = 1
METADATA = "metadata.json"
MODEL_STATES = "model_states.pt"
LATEST = "latest"


def shard_name(rank: int, prefix: str = "") -> str:
    return f"{prefix}rank_{rank}_shard.pt"


def tensor_prefix(model_rank: int, tensor_size: int) -> str:
    """The file-name prefix of one tensor rank's files; none without tensor parallelism (the plain layout)."""
    return f"model_{model_rank:02d}-" if tensor_size > 1 else ""


def resolve_tag(checkpoint_dir: str, tag: str | None) -> str | None:
    """The tag to load: the given one, else the content of ``latest`` (None when absent)."""
    if tag is not None:
        return str(tag)
    latest = os.path.join(checkpoint_dir, LATEST)
    if not os.path.isfile(latest):
        return None
    with open(latest, encoding="utf-8") as handle:
        return handle.read().strip()


def tag_dir(checkpoint_dir: str, tag: str) -> str:
    path = os.path.join(checkpoint_dir, tag)
    previous = os.path.join(checkpoint_dir, f".{tag}.old")   # a save of the same tag killed mid-swap
    if not os.path.isfile(os.path.join(path, METADATA)) and os.path.isfile(os.path.join(previous, METADATA)):
        return previous
    if not os.path.isfile(os.path.join(path, METADATA)):
        if not os.path.isdir(checkpoint_dir):
            raise CheckpointError(f"checkpoint directory not found: {checkpoint_dir}",
                                  hint="pass the save_dir given to save_checkpoint")
        tags = sorted(t for t in os.listdir(checkpoint_dir)
                      if os.path.isfile(os.path.join(checkpoint_dir, t, METADATA)))
        raise CheckpointError(f"no checkpoint '{tag}' in {checkpoint_dir}",
                              hint=f"available tags: {', '.join(tags)}" if tags else "save a checkpoint first")
    return path


def metadata_name(model_rank: int = 0) -> str:
    """Tensor rank 0's metadata is the tag's ``metadata.json`` (what marks a complete checkpoint)."""
    return METADATA if model_rank == 0 else f"model_{model_rank:02d}-{METADATA}"


def read_metadata(path: str, name: str = METADATA, expected: dict | None = None) -> dict[str, Any]:
    """A tag's metadata; ``expected`` (its manifest entry) checks it against its digest first."""
    if expected is not None:
        digest.check_file(os.path.join(path, name), expected)
    try:
        with open(os.path.join(path, name), encoding="utf-8") as handle:
            metadata = json.load(handle)
    except (OSError, ValueError) as error:
        raise CheckpointDamagedError(f"{path}/{name}: unreadable ({error})", hint="the checkpoint is damaged") from None
    if metadata.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {metadata.get('format')!r} is not {FORMAT_VERSION}",
                              hint="this checkpoint was written by another version or tool")
    return metadata


def load_file(path: str, expected: dict | None = None):
    """``torch.load`` one checkpoint file; ``expected`` (its manifest entry) checks size and digest first."""
    import torch

    if not os.path.isfile(path):
        raise CheckpointDamagedError(f"checkpoint file missing: {path}", hint="the checkpoint is incomplete")
    if expected is not None:
        digest.check_file(path, expected)
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # torch raises many kinds for a damaged file
        raise CheckpointDamagedError(f"{path}: unreadable ({type(error).__name__}: {error})",
                              hint="the checkpoint is damaged") from None


def ranks_overlapping(metadata: dict, wanted: dict[str, list[tuple[int, int]]]) -> list[int]:
    """Saved ranks holding any part of the wanted ``{name: [(start, end), ...]}`` ranges."""
    ranks = []
    for rank, listing in enumerate(metadata["ranks"]):
        for name, start, numel in listing:
            if any(start < end and low < start + numel for low, end in wanted.get(name, ())):
                ranks.append(rank)
                break
    return ranks


def copy_overlap(target, target_start: int, source, source_start: int) -> None:
    """Copy the overlap of two slices of one flattened parameter (``*_start`` = element offsets)."""
    low = max(target_start, source_start)
    high = min(target_start + target.numel(), source_start + source.numel())
    if low < high:
        target[low - target_start:high - target_start].copy_(source[low - source_start:high - source_start])


def full_fp32_params(path: str, metadata: dict, prefix: str = "") -> dict:
    """Every trainable parameter rebuilt whole in fp32 from all shards (consolidation), of one tensor rank."""
    import torch

    full = {p["name"]: torch.zeros(p["numel"], dtype=torch.float32) for p in metadata["params"]}
    for rank in range(metadata["world_size"]):
        shard = load_file(os.path.join(path, shard_name(rank, prefix)))
        for fragment in shard["fragments"]:
            target = full[fragment["name"]]
            copy_overlap(target, 0, fragment["fp32"].float(), fragment["param_start"])
    return {p["name"]: full[p["name"]].view(p["shape"]) for p in metadata["params"]}


def newest_intact(load_dir: str, tag: str, explicit: bool, read, agree):
    """The first intact tag, as every rank sees it: ``tag`` (asked for by name when ``explicit``,
    else 'latest''s), then the other complete tags, newest saved first. ``read(path)`` reads or
    checks this rank's files of a tag (raising CheckpointDamagedError); ``agree(problem)`` gathers
    every rank's problem ("" for none), so all ranks take the same tag. Returns
    ``(tag, read's value, [(damaged tag, its first problem)])``; a damaged tag asked for by name,
    or no intact tag, is a CheckpointDamagedError on every rank."""
    candidates = [tag] if explicit else [tag] + [t for t in tags_newest_first(load_dir) if t != tag]
    damaged: list[tuple[str, str]] = []
    for candidate in candidates:
        try:
            value, problem = read(tag_dir(load_dir, candidate)), ""
        except CheckpointDamagedError as error:
            value, problem = None, str(error)
        problems = [p for p in agree(problem) if p]
        if not problems:
            return candidate, value, damaged
        if explicit:
            raise CheckpointDamagedError(f"checkpoint '{tag}' is damaged: {problems[0]}",
                                         hint="restore the file from a copy, or load another tag (without tag= "
                                              "load_checkpoint takes the newest intact one)")
        damaged.append((candidate, problems[0]))
    every = "; ".join(f"'{t}': {p}" for t, p in damaged)
    raise CheckpointDamagedError(f"no intact checkpoint in {load_dir}: {every}",
                                 hint="restore the damaged files from a copy, or start without load_checkpoint")


def tags_newest_first(checkpoint_dir: str) -> list[str]:
    """The complete tags in a checkpoint folder (those with metadata), the newest saved first."""
    found = []
    for name in os.listdir(checkpoint_dir):
        marker = os.path.join(checkpoint_dir, name, METADATA)
        if not name.startswith(".") and os.path.isfile(marker):
            found.append((os.path.getmtime(marker), name))
    return [name for _, name in sorted(found, reverse=True)]

"""``dslaunch-to-deepspeed``: a checkpoint of this engine, or DeepSpeed's own at another world size,
written in DeepSpeed 0.19.8's layout for a DeepSpeed job to ``load_checkpoint``.

    dslaunch-to-deepspeed CHECKPOINT_DIR OUTPUT_DIR [--tag TAG] [--world_size N] [--stage S]
                          [--dtype fp32|bf16|fp16] [--sub_group_size N]

Defaults: the checkpoint's own world size, stage and precision. DeepSpeed must then run that
stage and precision (its loader reads only its own stage's files); the world size is the one
DeepSpeed loads at (it cannot repartition optimizer states itself).
"""
from __future__ import annotations

import argparse
import os
import sys

from launcher.zero.checkpoint import deepspeed_writer as writer
from launcher.zero.checkpoint import digest
from launcher.zero.checkpoint.consolidate import run_converter
from launcher.zero.checkpoint import format as fmt
from launcher.zero.checkpoint.deepspeed_layout import DeepSpeedCheckpointError
from launcher.zero.checkpoint.deepspeed_reader import DeepSpeedCheckpoint, is_deepspeed_checkpoint

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def open_checkpoint(checkpoint_dir: str, tag: str | None = None):
    """(metadata, model states, shard(rank)) of a checkpoint folder, this engine's or DeepSpeed's, and its tag."""
    checkpoint_dir = os.fspath(checkpoint_dir)
    resolved = fmt.resolve_tag(checkpoint_dir, tag)
    if resolved is None:
        raise DeepSpeedCheckpointError(f"no 'latest' file in {checkpoint_dir}",
                                       hint="pass --tag (the name of a checkpoint folder)")
    path = os.path.join(checkpoint_dir, resolved)
    if is_deepspeed_checkpoint(path):
        source = DeepSpeedCheckpoint(path)
        return source.metadata(), source.model_states(), source.shard, resolved
    path = fmt.tag_dir(checkpoint_dir, resolved)
    digest.check_tag(path)   # a damaged file is named, not written out as DeepSpeed's
    metadata = fmt.read_metadata(path)
    if metadata.get("kind") == "pipeline" or metadata.get("tensor_parallel"):
        raise DeepSpeedCheckpointError(f"{path}: a pipeline or tensor-parallel checkpoint cannot be written "
                                       "in DeepSpeed's layout", hint="dslaunch-zero-to-fp32 gives its fp32 weights")
    states = fmt.load_file(os.path.join(path, fmt.MODEL_STATES))
    return metadata, states, lambda rank: fmt.load_file(os.path.join(path, fmt.shard_name(rank))), resolved


def convert(checkpoint_dir, output_dir, tag: str | None = None, world_size: int | None = None,
            stage: int | None = None, dtype: str | None = None, sub_group_size: int = 1_000_000_000) -> str:
    """Write ``output_dir/<tag>`` (and ``latest``) in DeepSpeed's layout; returns the tag folder."""
    import torch

    metadata, states, shard, resolved = open_checkpoint(checkpoint_dir, tag)
    saved_dtype = str(metadata.get("param_dtype", "torch.float32")).replace("torch.", "")
    name = DTYPES.get(dtype, dtype) if dtype else saved_dtype
    if name not in DTYPES.values():
        raise DeepSpeedCheckpointError(f"unknown precision {dtype!r}", hint="use fp32, bf16 or fp16")
    target = writer.Target(world_size=int(world_size or metadata["world_size"]),
                           stage=int(metadata["stage"] if stage is None else stage),
                           dtype=getattr(torch, name), sub_group_size=int(sub_group_size))
    os.makedirs(os.fspath(output_dir), exist_ok=True)
    return writer.write(writer.gather(metadata, states, shard), os.fspath(output_dir), resolved, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dslaunch-to-deepspeed", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint_dir",
                        help="the save_dir of a checkpoint (holds 'latest'): this engine's or DeepSpeed's")
    parser.add_argument("output_dir", help="where to write DeepSpeed's layout (the DeepSpeed job's load_dir)")
    parser.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    parser.add_argument("--world_size", type=int, default=None,
                        help="DeepSpeed's data-parallel size (default: as saved)")
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=None, help="DeepSpeed's ZeRO stage")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="DeepSpeed's precision")
    parser.add_argument("--sub_group_size", type=int, default=1_000_000_000,
                        help="the DeepSpeed job's zero_optimization.sub_group_size (stage 3)")
    args = parser.parse_args(argv)
    return run_converter("dslaunch-to-deepspeed", args.output_dir, lambda: convert(
        args.checkpoint_dir, args.output_dir, args.tag, args.world_size, args.stage, args.dtype, args.sub_group_size))


if __name__ == "__main__":
    sys.exit(main())

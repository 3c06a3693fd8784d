"""A plain fp32 state dict from a ZeRO checkpoint (any stage, any world size), and its CLI.

    dslaunch-zero-to-fp32 CHECKPOINT_DIR OUT.pt [--tag TAG] [--exclude_frozen_parameters]
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import OrderedDict

from launcher.errors import DslaunchError
from launcher.zero.checkpoint import digest
from launcher.zero.checkpoint import format as fmt
from launcher.zero.checkpoint.deepspeed_reader import DeepSpeedCheckpoint, is_deepspeed_checkpoint
from launcher.zero.errors import CheckpointError


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters: bool = False) -> OrderedDict:
    """The module's state dict with every trainable parameter rebuilt in fp32 from the shards."""
    import torch

    checkpoint_dir = os.fspath(checkpoint_dir)
    if not os.path.isdir(checkpoint_dir):
        raise CheckpointError(f"checkpoint directory not found: {checkpoint_dir}",
                              hint="pass the save_dir given to save_checkpoint")
    resolved = fmt.resolve_tag(checkpoint_dir, tag)
    if resolved is None and tag is None and os.path.isfile(os.path.join(checkpoint_dir, fmt.METADATA)):
        # the folder of one checkpoint (save_dir/global_step30) was given: take it as the tag
        checkpoint_dir, resolved = os.path.split(os.path.normpath(checkpoint_dir))
    if resolved is None:
        raise CheckpointError(f"no 'latest' file in {checkpoint_dir}", hint="pass --tag (the name of a checkpoint folder)")
    if is_deepspeed_checkpoint(os.path.join(checkpoint_dir, resolved)):   # what DeepSpeed's zero_to_fp32 reads
        return _deepspeed_state_dict(os.path.join(checkpoint_dir, resolved), exclude_frozen_parameters)
    path = fmt.tag_dir(checkpoint_dir, resolved)
    digest.check_tag(path)   # a damaged file is named, not consolidated into wrong weights
    metadata = fmt.read_metadata(path)
    if metadata.get("kind") == "pipeline":   # a pipeline / 3D checkpoint: per-layer files, tensor shards joined
        from launcher.zero.checkpoint.pipeline_save_load import consolidate   # imports torch: not for --help

        return OrderedDict(consolidate(path, metadata))
    tensor = metadata.get("tensor_parallel")
    if tensor:       # zero.initialize(mpu=): each tensor rank's state dict, its shards joined on their dims
        shards = [_state_dict(path, fmt.read_metadata(path, fmt.metadata_name(m)), fmt.tensor_prefix(m, tensor["size"]),
                              exclude_frozen_parameters) for m in range(tensor["size"])]
        dims = tensor["partition_dims"]
        return OrderedDict((key, torch.cat([shard[key] for shard in shards], dim=dims[key]) if key in dims else value)
                           for key, value in shards[0].items())
    return _state_dict(path, metadata, "", exclude_frozen_parameters)


def _state_dict(path: str, metadata: dict, prefix: str, exclude_frozen_parameters: bool) -> OrderedDict:
    """One (tensor rank's) plain ZeRO checkpoint as a state dict: trainable parameters rebuilt in fp32."""
    module_state = fmt.load_file(os.path.join(path, prefix + fmt.MODEL_STATES))["module"]
    return _join(module_state, fmt.full_fp32_params(path, metadata, prefix), metadata, exclude_frozen_parameters)


def _join(module_state: dict, trainable: dict, metadata: dict, exclude_frozen_parameters: bool) -> OrderedDict:
    """The module's state dict with the trainable parameters replaced by their fp32 values."""
    import torch

    shared = metadata.get("shared_params", {})
    frozen = set(metadata.get("frozen_params", []))
    state = OrderedDict()
    for key, value in module_state.items():
        if key in trainable:
            state[key] = trainable[key]
        elif key in shared and shared[key] in trainable:
            state[key] = trainable[shared[key]]  # tied weights stay one tensor
        elif exclude_frozen_parameters and key in frozen:
            continue
        else:
            state[key] = value.float() if torch.is_tensor(value) and value.is_floating_point() else value
    for key, value in trainable.items():
        state.setdefault(key, value)
    return state


def _deepspeed_state_dict(path: str, exclude_frozen_parameters: bool) -> OrderedDict:
    """A DeepSpeed 0.19.8 tag folder's state dict: trainable parameters in fp32, the rest as saved."""
    source = DeepSpeedCheckpoint(path)
    return _join(source.model_states()["module"], source.full_fp32_params(), source.metadata(),
                 exclude_frozen_parameters)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_file, tag=None, exclude_frozen_parameters: bool = False) -> str:
    """Write the fp32 state dict to ``output_file`` (a folder gets ``pytorch_model.bin``)."""
    import torch

    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    output_file = os.fspath(output_file)
    if os.path.isdir(output_file):
        output_file = os.path.join(output_file, "pytorch_model.bin")
    parent = os.path.dirname(os.path.abspath(output_file))
    if not os.path.isdir(parent):
        raise CheckpointError(f"output folder does not exist: {parent}", hint="create it first")
    with open(output_file, "wb") as handle:  # an unwritable path is an OSError, not torch's RuntimeError
        torch.save(state, handle)
    return output_file


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Load the consolidated fp32 weights into ``model`` (moved to fp32) and return it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.float()
    model.load_state_dict(state, strict=False)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dslaunch-zero-to-fp32",
                                     description="Consolidate a launcher.zero checkpoint into one fp32 state dict.")
    parser.add_argument("checkpoint_dir", help="the save_dir given to save_checkpoint (holds 'latest'), "
                        "or one checkpoint's folder in it (save_dir/global_step30)")
    parser.add_argument("output_file", help="where to write the state dict (torch.save format)")
    parser.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    parser.add_argument("--exclude_frozen_parameters", "--exclude-frozen-parameters", action="store_true",
                        help="leave out parameters that were not trained")
    args = parser.parse_args(argv)
    return run_converter("dslaunch-zero-to-fp32", args.output_file, lambda: convert_zero_checkpoint_to_fp32_state_dict(
        args.checkpoint_dir, args.output_file, args.tag, args.exclude_frozen_parameters))


def run_converter(program: str, target: str, convert) -> int:
    """A converter command's ending: ``convert()``'s path written, or its typed error (and hint) or an
    unwritable ``target`` on stderr with the exit code."""
    try:
        written = convert()
    except DslaunchError as error:
        print(f"{program}: {error.kind}: {error.message}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
        return error.exit_code
    except OSError as error:
        print(f"{program}: error: cannot write {target}: {error.strerror}", file=sys.stderr)
        return 1
    print(f"wrote {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""DeepSpeed's ``zero_to_fp32`` file helpers: where its per-rank files are in a checkpoint's tag folder.

Lightning's ``convert_zero_checkpoint_to_fp32_state_dict`` calls ``get_fp32_state_dict_from_zero_checkpoint``
(which reads this engine's checkpoints) and then these, to read the stage and the client state out of
DeepSpeed's own files (``*_optim_states.pt``, ``mp_rank_00_model_states.pt``). They behave as DeepSpeed
0.19.8's on a folder holding those files. This engine writes its own layout (checkpoint/format.py), which
has no such files: on one of its folders they raise ``NotSupportedError`` naming the helper and what works.
"""
from __future__ import annotations

import glob
import os
import re

from launcher.zero.checkpoint import deepspeed_layout as layout
from launcher.zero.checkpoint import format as fmt
from launcher.zero.errors import NotSupportedError


def _natural_key(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _ours(checkpoint_dir: str, helper: str, wanted: str) -> NotSupportedError:
    return NotSupportedError(
        f"deepspeed.utils.zero_to_fp32.{helper}: {checkpoint_dir} is a dslaunch checkpoint ({fmt.METADATA}, "
        f"rank_<r>_shard.pt), not DeepSpeed's per-rank files ({wanted})",
        hint="get_fp32_state_dict_from_zero_checkpoint(save_dir) reads it into one fp32 state dict "
             "(or: dslaunch-zero-to-fp32 save_dir out.pt); the client state is model_states.pt's 'client_state'")


def get_checkpoint_files(checkpoint_dir, glob_pattern: str) -> list[str]:
    """The files of a tag folder matching ``glob_pattern``, in natural order (rank 2 before rank 10)."""
    return _find(checkpoint_dir, glob_pattern, "get_checkpoint_files")


def _find(checkpoint_dir, glob_pattern: str, helper: str) -> list[str]:
    checkpoint_dir = os.fspath(checkpoint_dir)
    files = sorted(glob.glob(os.path.join(checkpoint_dir, glob_pattern)), key=_natural_key)
    if not files:
        if os.path.isfile(os.path.join(checkpoint_dir, fmt.METADATA)):
            raise _ours(checkpoint_dir, helper, glob_pattern)
        raise FileNotFoundError(f"can't find {glob_pattern} files in directory '{checkpoint_dir}'")
    return files


def get_optim_files(checkpoint_dir) -> list[str]:
    return _find(checkpoint_dir, "*_optim_states.pt", "get_optim_files")


def get_model_state_files(checkpoint_dir) -> list[str]:
    return _find(checkpoint_dir, "*_model_states.pt", "get_model_state_files")


def get_model_state_file(checkpoint_dir, zero_stage: int) -> str:
    """Rank 0's model states file: ``mp_rank_00_model_states.pt`` up to stage 2, the per-rank one at 3."""
    checkpoint_dir = os.fspath(checkpoint_dir)
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"Directory '{checkpoint_dir}' doesn't exist")
    name = layout.MODEL_STATES if zero_stage <= 2 else layout.zero_model_states_name(0)
    path = os.path.join(checkpoint_dir, name)
    if not os.path.exists(path):
        if os.path.isfile(os.path.join(checkpoint_dir, fmt.METADATA)):
            raise _ours(checkpoint_dir, "get_model_state_file", name)
        raise FileNotFoundError(f"can't find model states file at '{path}'")
    return path

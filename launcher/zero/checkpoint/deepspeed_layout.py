"""DeepSpeed 0.19.8's checkpoint folder: its file names, how ZeRO cuts parameters into per-rank
partitions, and its pickles read and written without DeepSpeed installed.

    save_dir/latest                          the tag, as in this engine's layout
    save_dir/<tag>/
      mp_rank_00_model_states.pt             stages 0-2: module state dict, scheduler, counters,
                                             client state (merged at the top level); stage 0 also
                                             the optimizer
      zero_pp_rank_<r>_mp_rank_00_model_states.pt    stage 3: one per rank (params are placeholders)
      [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt   stages 1-3: rank r's partition of the
                                             fp32 masters and of the optimizer state

Partitions (glossary: a *piece* is the part of one parameter inside one rank's flat partition):
stages 1 and 2 concatenate a param group's parameters into one flat tensor, pad it to a multiple
of 2 x world size and cut it into world-size equal partitions (``stage_1_and_2.py``); stage 3
cuts every parameter on its own into ceil(numel / world size) elements a rank and concatenates a
rank's slices (``stage3.py``, ``zero_to_fp32.py``).

DeepSpeed pickles a few of its own objects into these files (the loss scaler, ``ZeroStageEnum``,
``fragment_address``). Reading maps every ``deepspeed.*`` class to a stand-in that keeps the
object's fields (DeepSpeed is never imported: under ``--as-deepspeed`` that name is this engine);
writing emits DeepSpeed's class names, so DeepSpeed reads its own objects back.
"""
from __future__ import annotations

import copyreg
import math
import os
import pickle
import types
from dataclasses import dataclass

from launcher.zero.errors import CheckpointError

MODEL_STATES = "mp_rank_00_model_states.pt"
DEEPSPEED_VERSION = "0.19.8"
# the DeepSpeed objects this engine writes, by their import path in DeepSpeed
STATIC_SCALER = "deepspeed.runtime.fp16.loss_scaler.LossScaler"
DYNAMIC_SCALER = "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"
ZERO_STAGE_ENUM = "deepspeed.runtime.zero.config.ZeroStageEnum"
FRAGMENT_ADDRESS = "deepspeed.utils.tensor_fragment.fragment_address"


class DeepSpeedCheckpointError(CheckpointError):
    """A DeepSpeed checkpoint folder that is incomplete or not one this engine can continue."""


def zero_model_states_name(rank: int) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"


def optim_states_name(rank: int, bf16: bool) -> str:
    return f"{'bf16_' if bf16 else ''}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def is_deepspeed_tag(path: str) -> bool:
    """True for a tag folder DeepSpeed wrote: its model-states file is there, or at least one of its
    optimizer files (the model states missing is then an error naming that file, not "no checkpoint")."""
    if any(os.path.isfile(os.path.join(path, name)) for name in (MODEL_STATES, zero_model_states_name(0))):
        return True
    return os.path.isdir(path) and any(name.endswith("_optim_states.pt") and "zero_pp_rank_" in name
                                       for name in os.listdir(path))


# ---- partitions -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    """The part of one parameter inside one rank's flat partition."""

    name: str
    group: int
    param_start: int        # first element of the piece in the flattened parameter
    numel: int
    offset: int             # where the piece starts in the rank's flat partition


def stage12_pieces(group_params: list[tuple[str, int]], group: int, world_size: int,
                   paddings: list[int] | None = None) -> tuple[list[list[Piece]], int]:
    """Stages 1/2: each rank's pieces of one param group ``[(name, numel), ...]``, and the partition
    size (DeepSpeed pads the flat group to a multiple of 2 x world size, then cuts it evenly)."""
    paddings = paddings or [0] * len(group_params)
    flat = sum(numel for _, numel in group_params) + sum(paddings)
    alignment = 2 * world_size
    size = math.ceil(flat / alignment) * alignment // world_size
    pieces: list[list[Piece]] = [[] for _ in range(world_size)]
    start = 0
    for (name, numel), padding in zip(group_params, paddings):
        for rank in range(world_size):
            low, high = max(start, rank * size), min(start + numel, (rank + 1) * size)
            if low < high:
                pieces[rank].append(Piece(name, group, low - start, high - low, low - rank * size))
        start += numel + padding
    return pieces, size


def stage3_pieces(params: list[tuple[str, int, int]], world_size: int) -> list[list[Piece]]:
    """Stage 3: each rank's pieces of ``[(name, group, numel), ...]`` in their saved order; every
    parameter is cut on its own into ceil(numel / world size) elements a rank (the last padded)."""
    pieces: list[list[Piece]] = [[] for _ in range(world_size)]
    offset = 0
    for name, group, numel in params:
        share = math.ceil(numel / world_size)
        for rank in range(world_size):
            low, high = rank * share, min((rank + 1) * share, numel)
            if low < high:
                pieces[rank].append(Piece(name, group, low, high - low, offset))
        offset += share
    return pieces


# ---- pickles ----------------------------------------------------------------------------------------
class Foreign:
    """A DeepSpeed object without DeepSpeed: its class path, constructor arguments and fields.

    Read back, it is what DeepSpeed pickled; written, it pickles as DeepSpeed's own class: rebuilt
    as ``cls(*args)`` when made by ``deepspeed_call`` (an enum member, a named tuple), else as an
    instance whose fields are set (what pickle does for DeepSpeed's plain objects).
    """

    deepspeed_path = "deepspeed"

    def __new__(cls, *args, **kwargs):
        instance = super().__new__(cls)
        instance.__dict__["_args"] = args
        return instance

    def __init__(self, *args, **kwargs):   # called only when pickle rebuilt it as cls(*args)
        self.__dict__["_args"] = args
        self.__dict__["_called"] = True

    def __setstate__(self, state):
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})

    def __reduce_ex__(self, protocol):
        fields = {key: value for key, value in self.__dict__.items() if key not in ("_args", "_called")}
        if self.__dict__.get("_called"):
            return type(self), tuple(self._args)
        return copyreg.__newobj__, (type(self),), fields

    def __repr__(self) -> str:
        return f"<{self.deepspeed_path} {self.__dict__}>"


_FOREIGN: dict[str, type] = {}


def foreign_class(path: str) -> type:
    """The stand-in class for DeepSpeed's ``path`` (one per path, so identity checks hold)."""
    if path not in _FOREIGN:
        _FOREIGN[path] = type(path.rsplit(".", 1)[-1], (Foreign,), {"deepspeed_path": path})
    return _FOREIGN[path]


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "deepspeed" or module.startswith("deepspeed."):
            return foreign_class(f"{module}.{name}")
        return super().find_class(module, name)


class _Pickler(pickle._Pickler):  # the Python pickler: its save_global can name a class by path
    def save_global(self, obj, name=None):
        path = getattr(obj, "deepspeed_path", None) if isinstance(obj, type) else None
        if path is None or not issubclass(obj, Foreign):
            return super().save_global(obj, name)
        module, _, attribute = path.rpartition(".")
        self.write(pickle.GLOBAL + module.encode() + b"\n" + attribute.encode() + b"\n")
        self.memoize(obj)


# what torch.load / torch.save take as pickle_module
PICKLE_MODULE = types.SimpleNamespace(Unpickler=_Unpickler, Pickler=_Pickler, load=pickle.load,
                                      dump=pickle.dump, __name__="deepspeed_pickle")


def deepspeed_object(path: str, **fields):
    """An object that DeepSpeed unpickles as an instance of its class ``path`` with these fields."""
    instance = object.__new__(foreign_class(path))
    instance.__dict__.update(fields)
    return instance


def deepspeed_call(path: str, *args):
    """A value DeepSpeed unpickles as ``path(*args)`` (an enum member, a named tuple)."""
    return foreign_class(path)(*args)


def plain(value):
    """A DeepSpeed enum or named tuple read back: its first constructor argument, else itself."""
    return value._args[0] if isinstance(value, Foreign) and value._args else value


def load(path: str, what: str):
    """One DeepSpeed file (``what`` names it in errors); a typed error when absent or unreadable."""
    import torch

    if not os.path.isfile(path):
        raise DeepSpeedCheckpointError(f"{path}: missing ({what})",
                                       hint="the DeepSpeed checkpoint is incomplete: copy every file of the tag folder")
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=PICKLE_MODULE)
    except Exception as error:  # torch raises many kinds for a damaged file
        raise DeepSpeedCheckpointError(f"{path}: unreadable ({type(error).__name__}: {error})",
                                       hint="the DeepSpeed checkpoint is damaged") from None


def save(value, path: str) -> None:
    import torch

    torch.save(value, path, pickle_module=PICKLE_MODULE)

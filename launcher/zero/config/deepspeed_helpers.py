"""DeepSpeed's config helpers that scripts and integrations import (``deepspeed.runtime.config_utils``:
the ``get_*_param`` readers, the duplicate-key JSON hook, the JSON encoder DeepSpeed prints configs
with, ``pp_int``, ``DeepSpeedConfigObject``), and ``ZeroStageEnum`` (``deepspeed.runtime.zero.config``).
Torch-free, as the config loader is.

``DeepSpeedConfigModel`` (a pydantic model) is in pydantic_model.py: pydantic is not a dependency.
"""
from __future__ import annotations

import collections
import collections.abc
import enum
import json

ZERO_OPTIMIZATION = "zero_optimization"


class ZeroStageEnum(int, enum.Enum):
    """DeepSpeed's ZeRO stages (its checkpoints pickle them; Trainer forks list the class in
    ``torch.serialization.add_safe_globals``)."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


def get_scalar_param(param_dict: dict, param_name: str, param_default_value):
    return param_dict.get(param_name, param_default_value)


def get_list_param(param_dict: dict, param_name: str, param_default_value):
    return param_dict.get(param_name, param_default_value)


def get_dict_param(param_dict: dict, param_name: str, param_default_value):
    return param_dict.get(param_name, param_default_value)


def dict_raise_error_on_duplicate_keys(ordered_pairs) -> dict:
    """``json.load(..., object_pairs_hook=)``: a key given twice is a ValueError naming it."""
    result = dict(ordered_pairs)
    if len(result) != len(ordered_pairs):
        counts = collections.Counter(key for key, _ in ordered_pairs)
        raise ValueError(f"Duplicate keys in DeepSpeed config: {[key for key, n in counts.items() if n > 1]}")
    return result


class pp_int(int):  # noqa: N801 - DeepSpeed's name
    """An int whose repr has thousands separators, or a text of its own (for printed defaults)."""

    def __new__(cls, val, custom_print_str=None):
        inst = super().__new__(cls, val)
        inst.custom_print_str = custom_print_str
        return inst

    def __repr__(self) -> str:
        return self.custom_print_str or f"{self.real:,}"


class ScientificNotationEncoder(json.JSONEncoder):
    """DeepSpeed's config printer: numbers above 1e3 in scientific notation, four-space indents."""

    def iterencode(self, o, _one_shot=False, level=0):
        indent = self.indent if self.indent is not None else 4
        closing, level = " " * level * indent, level + 1
        prefix = " " * level * indent
        if isinstance(o, bool):
            return "true" if o else "false"
        if isinstance(o, (int, float)):
            return f"{o:e}" if o > 1e3 else f"{o}"
        if isinstance(o, collections.abc.Mapping):
            items = [f'\n{prefix}"{k}": {self.iterencode(v, level=level)}' for k, v in o.items()]
            return "{" + ", ".join(items) + f"\n{closing}" + "}"
        if isinstance(o, collections.abc.Sequence) and not isinstance(o, str):
            return f"[{', '.join(map(self.iterencode, o))}]"
        return "\n, ".join(super().iterencode(o, _one_shot))


class DeepSpeedConfigObject:
    """DeepSpeed's base of config-like objects: ``repr`` is the attributes as JSON."""

    def repr(self) -> dict:
        return self.__dict__

    def __repr__(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, indent=4, default=str)

"""``deepspeed.moe``: Mixture of Experts (``layer.MoE``, ``utils.*``, ``sharded_moe``, ``experts``).

The layer and its helpers live in ``launcher.zero.experts``; these modules re-export them under
DeepSpeed's paths. ``zero.initialize`` builds the expert groups and hands them to the layers.
Importing this package is torch-free until a name is used.
"""
from __future__ import annotations

import importlib
from typing import Any

_MODULES = ("layer", "utils", "sharded_moe", "experts")

__all__ = list(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'launcher.zero.moe' (deepspeed.moe) has no attribute '{name}'")
    return importlib.import_module(f"{__name__}.{name}")

"""``deepspeed.pipe``: pipeline parallelism (``PipelineModule``, ``LayerSpec``, ``TiedLayerSpec``, topologies).

``zero.initialize(model=PipelineModule(...), config=...)`` returns a ``PipelineEngine``. Importing
this package is torch-free until a name is used.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "PipelineModule": "launcher.zero.pipeline.module",
    "LayerSpec": "launcher.zero.pipeline.module",
    "TiedLayerSpec": "launcher.zero.pipeline.module",
    "PipelineEngine": "launcher.zero.pipeline.engine",
    "ProcessTopology": "launcher.zero.parallel.topology",
    "PipeDataParallelTopology": "launcher.zero.parallel.topology",
    "PipeModelDataParallelTopology": "launcher.zero.parallel.topology",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'launcher.zero.pipe' (deepspeed.pipe) has no attribute '{name}'")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value

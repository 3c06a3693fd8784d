"""The bundled ZeRO training engine, with DeepSpeed's API: ``from launcher import zero``.

    engine, optimizer, dataloader, lr_scheduler = zero.initialize(model=model, config="ds.json")

Importing this package is torch-free (the launcher validates configs with it); everything that
needs torch is imported on first use through the module ``__getattr__`` below, so a missing
optional piece (ZeRO-3, sparse attention, ...) fails only when it is used.

The house: this root and ``accelerator``, ``comm``, ``checkpointing``, ``zero/``, ``utils/``,
``runtime/``, ``ops/``, ``pipe/``, ``moe/``, ``profiling/`` are the DeepSpeed-shaped face (what ``deepspeed.X``
resolves to under ``--as-deepspeed``; ``shim/paths.py`` lists every such path). They only
re-export; nothing below imports them. ``errors`` is shared by both. The internals, free to change,
in layers from the top (every import points down; tests/unit/zero/test_engine_layers.py holds the order):
``assembly/`` (initialize for both engines); ``pipeline/`` (the pipeline engine); ``engine/`` (the
data-parallel engine and its step, observers, compile); ``checkpoint/``, ``flops/`` (FLOPs counting,
the profiler's report, MFU); ``stages/`` (ZeRO 0-3, the strategies); the shared pieces
``precision/`` (dtypes, the skip rule, the fp16 loss scaler), ``data/`` (the loader), ``experts/``,
``optim/``, ``layout/``, ``parallel/`` (tensor and sequence parallelism, topologies),
``activations/`` (activation checkpointing), ``sparse_attention/``; ``distributed/`` (the
DistContext, collectives, accelerator); ``config/`` (load, schema, checks; torch-free);
``sched/``; ``failure`` (how an uncaught error ends a rank) and ``stall_beat`` (the ``--stall_timeout`` beat).
tests/unit/zero/test_house.py holds the face's rules.
"""
from __future__ import annotations

import importlib
from typing import Any

from launcher.zero.errors import CheckpointError, ConfigError
from launcher.zero.shim.paths import DEEPSPEED_VERSION as __version__  # the DeepSpeed release we match

# name -> (module, attribute or None for the module itself)
_LAZY = {
    "initialize": ("launcher.zero.assembly.initialize", "initialize"),
    "init_distributed": ("launcher.zero.comm", "init_distributed"),
    "add_config_arguments": ("launcher.zero.config.args", "add_config_arguments"),
    "ZeroEngine": ("launcher.zero.engine.zero_engine", "ZeroEngine"),
    "DeepSpeedEngine": ("launcher.zero.engine.zero_engine", "ZeroEngine"),
    "get_fp32_state_dict_from_zero_checkpoint": ("launcher.zero.checkpoint.consolidate", "get_fp32_state_dict_from_zero_checkpoint"),
    "convert_zero_checkpoint_to_fp32_state_dict": ("launcher.zero.checkpoint.consolidate", "convert_zero_checkpoint_to_fp32_state_dict"),
    "load_state_dict_from_zero_checkpoint": ("launcher.zero.checkpoint.consolidate", "load_state_dict_from_zero_checkpoint"),
    "load_config": ("launcher.zero.config.load", "load_config"),
    "checkpointing": ("launcher.zero.checkpointing", None),
    "sparse_attention": ("launcher.zero.sparse_attention", None),
    "Init": ("launcher.zero.stages.stage3.init_context", "Init"),
    "GatheredParameters": ("launcher.zero.stages.stage3.init_context", "GatheredParameters"),
    "estimate_memory": ("launcher.zero.engine.estimate", "estimate_memory"),
    "get_accelerator": ("launcher.zero.distributed.accelerator", "get_accelerator"),
    "DeepSpeedConfigError": ("launcher.zero.errors", "ConfigError"),   # except DeepSpeedConfigError catches ours
    "OnDevice": ("launcher.zero.distributed.on_device", "OnDevice"),
    "version": ("launcher.zero.shim.version_info", "version"),
    "git_hash": ("launcher.zero.shim.version_info", "git_hash"),
    "git_branch": ("launcher.zero.shim.version_info", "git_branch"),
    "git_version_info": ("launcher.zero.git_version_info", None),
    # DeepSpeed names not built here: they import, and raise NotSupportedError where used
    **{name: ("launcher.zero.shim.stand_ins", name) for name in (
        "DeepSpeedConfig", "DeepSpeedTransformerConfig", "DeepSpeedTransformerLayer", "replace_transformer_layer",
        "init_inference", "tp_model_init")},
        # modules DeepSpeed scripts reach as deepspeed.<name> (see docs/migrating/deepspeed.md)
    "comm": ("launcher.zero.comm", None),
    "zero": ("launcher.zero.zero", None),
    "accelerator": ("launcher.zero.accelerator", None),
    "utils": ("launcher.zero.utils", None),
    "runtime": ("launcher.zero.runtime", None),
    "ops": ("launcher.zero.ops", None),
    "pipe": ("launcher.zero.pipe", None),
    "moe": ("launcher.zero.moe", None),
    "profiling": ("launcher.zero.profiling", None),
}

__all__ = ["ConfigError", "CheckpointError", *_LAZY]


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'launcher.zero' has no attribute '{name}'") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

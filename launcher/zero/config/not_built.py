"""DeepSpeed 0.16-0.19 config keys whose features this engine does not build: one table.

Each key loads at its DeepSpeed default (the value that turns the feature off); any other value is
refused when the config loads -- by ``dslaunch --dry-run --config`` before a rank starts, and by
``initialize`` before the rendezvous -- with a ConfigError naming the key and what to use instead.
A key that loaded and changed nothing would train something else than DeepSpeed does, silently.
docs/reference/config.md lists the same table (tests/unit/zero/test_config_new_keys.py holds it to this one).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from launcher.zero.errors import NotBuiltConfigError

_OFFLOAD = ('"offload_optimizer": {"device": "cpu"} moves the optimizer states and their step to the host '
            '("overlap_step": true runs that step while the next forward starts; "ratio": 0.3 offloads only '
            '30% of them, the rest stepped on the GPU, exact Adam)')


@dataclass(frozen=True)
class NotBuiltKey:
    """A DeepSpeed key this engine refuses away from ``accepted`` (its DeepSpeed default)."""

    key: str                 # the path, as the message names it
    feature: str             # what the key turns on in DeepSpeed
    hint: str                # what to use instead
    accepted: Any            # the value that loads (DeepSpeed's default: the feature off)
    example: Any             # a value that is refused, for the reference page
    later: str = ""          # the change that will build it, when one is planned
    only_if: str = ""        # a path that must be true for the key to act (as in DeepSpeed), else always

    def message(self, value: Any) -> str:
        text = f"{self.key} {show(value)}: {self.feature}: not built in dslaunch's engine"
        return text + (f" yet ({self.later})" if self.later else "")


NOT_BUILT = (
    NotBuiltKey("torch_autocast.enabled", "DeepSpeed's torch.autocast mode (fp32 weights, the forward under "
                "torch.autocast, Linear and Conv gradients reduced in 16 bits)",
                'use "bf16": {"enabled": true} (bf16 weights with fp32 master weights, DeepSpeed\'s own mixed '
                "precision), or keep fp32 and run your forward under torch.autocast yourself (the gradients are "
                "then reduced in fp32)", False, True),
    NotBuiltKey("zero_optimization.zenflow", "DeepSpeed's ZenFlow (the largest gradients' update on the device, "
                "the rest later on the CPU)", "remove zenflow; " + _OFFLOAD, None,
                {"topk_ratio": 0.05, "update_interval": 4}),
    NotBuiltKey("zero_optimization.offload_optimizer.super_offload", "DeepSpeed's SuperOffload (the offloaded "
                "step tuned for Grace superchips)", "remove super_offload; " + _OFFLOAD, False, True),
    NotBuiltKey("sequence_parallel_size", "DeepSpeed-Ulysses sequence parallelism",
                "remove sequence_parallel_size (or set 1); Megatron-style sequence parallelism with tensor "
                "parallelism is launcher.zero.parallel.sequence", 1, 2),
    NotBuiltKey("zero_optimization.zero_quantized_weights", "ZeRO++ quantized weights (qwZ)",
                "remove it: stage 3 all-gathers the weights in their training dtype (bf16 or fp16 move half "
                "the bytes of fp32)", False, True),
    NotBuiltKey("zero_optimization.zero_quantized_nontrainable_weights", "ZeRO++ quantized frozen weights",
                "remove it: frozen weights are gathered in their training dtype", False, True),
    NotBuiltKey("zero_optimization.zero_quantized_gradients", "ZeRO++ quantized gradients (qgZ)",
                'remove it; "communication_data_type": "bf16" (or "fp16") halves the bytes each gradient '
                "reduction moves", False, True),
    NotBuiltKey("zero_optimization.zero_hpz_partition_size", "ZeRO++ hierarchical partitioning (hpZ: a second "
                "copy of the weights inside each node)", "remove it (or set 1): stage 3 partitions over every "
                "rank", 1, 8),
    NotBuiltKey("zero_optimization.mics_shard_size", "MiCS sharding (removed from DeepSpeed in 0.19 too)",
                "remove mics_shard_size: stage 3 partitions over every rank", -1, 8),
    NotBuiltKey("zero_optimization.mics_hierarchical_params_gather", "MiCS hierarchical gathering (removed from "
                "DeepSpeed in 0.19 too)", "remove mics_hierarchical_params_gather", False, True),
)


def refuse_not_built(config: Any) -> None:
    """Raise NotBuiltConfigError for the first key of ``NOT_BUILT`` that ``config`` (a ZeroConfig)
    sets away from its accepted value."""
    for entry in NOT_BUILT:
        value = value_at(config, entry.key)
        acts = not entry.only_if or value_at(config, entry.only_if) is True
        if value is not _ABSENT and value != entry.accepted and acts:
            raise NotBuiltConfigError(entry.message(value), hint=entry.hint)


_ABSENT = object()


def value_at(config: Any, path: str) -> Any:
    """The value at a dotted path of a built config; ``_ABSENT`` where a section on the way is unset."""
    value = config
    for name in path.split("."):
        if value is None:
            return _ABSENT
        value = getattr(value, name)
    return value


def show(value: Any) -> str:
    """A value as a JSON config writes it."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)

"""Count the FLOPs of a stretch of work, per module, with torch's own ``FlopCounterMode``.

torch counts matrix products (mm, addmm, bmm, convolutions) and the fused attention kernels at
2 FLOPs per multiply-add; elementwise work (norms, activations, softmax, the optimizer) counts 0,
as in the usual model-FLOPs convention. The CPU attention kernel is added here: torch registers
the CUDA kernels only, so a CPU run would count no attention at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

GLOBAL = "Global"   # FlopCounterMode's name for "everything counted"


def _cpu_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_attention_backward(grad_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(grad_shape, query_shape, key_shape, value_shape)


def _extra_formulas() -> dict:
    aten = torch.ops.aten
    formulas = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        formulas[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_attention
        formulas[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_attention_backward
    return formulas


@dataclass
class FlopCount:
    """FLOPs counted between ``start()`` and ``stop()``: the total, the forward part, and per module."""

    forward: int = 0
    total: int = 0
    per_module: dict[str, int] = field(default_factory=dict)   # dotted name in the root ("" = the root)


class FlopCounter:
    """Counts while started; ``forward_done()`` marks where a forward pass ended (forward vs backward)."""

    def __init__(self):
        self._mode: FlopCounterMode | None = None
        self._forward = 0
        self._forward_from = 0

    @property
    def counting(self) -> bool:
        return self._mode is not None

    def start(self) -> None:
        self._mode = FlopCounterMode(display=False, depth=None, custom_mapping=_extra_formulas())
        self._mode.__enter__()
        self._forward, self._forward_from = 0, 0

    def forward_begins(self) -> None:
        if self._mode is not None:
            self._forward_from = self._mode.get_total_flops()

    def forward_done(self) -> None:
        if self._mode is not None:
            self._forward += self._mode.get_total_flops() - self._forward_from

    def stop(self) -> FlopCount:
        mode, self._mode = self._mode, None
        if mode is None:
            return FlopCount()
        mode.__exit__(None, None, None)
        return FlopCount(forward=self._forward, total=mode.get_total_flops(),
                         per_module=per_module(mode.get_flop_counts()))


def per_module(counts: dict[str, dict]) -> dict[str, int]:
    """FlopCounterMode's ``{"GPT.blocks.0.fc": {op: flops}}`` as ``{"blocks.0.fc": flops}``; the root is ""."""
    result: dict[str, int] = {}
    for name, ops in counts.items():
        if name == GLOBAL:
            continue
        inner = name.split(".", 1)[1] if "." in name else ""
        result[inner] = result.get(inner, 0) + sum(ops.values())
    # containers never called (ModuleList, ModuleDict) get the sum of their children
    for name in sorted((n for n in result if n), key=lambda n: -n.count(".")):
        parent = name.rsplit(".", 1)[0] if "." in name else None
        if parent is not None and parent not in counts_names(counts):
            result[parent] = result.get(parent, 0) + result[name]
    if GLOBAL in counts:   # the root's count: everything (its backward is not attributed to it by torch)
        result[""] = sum(counts[GLOBAL].values())
    return result


def counts_names(counts: dict[str, dict]) -> set[str]:
    """The dotted names torch counted, without the root's class name."""
    return {name.split(".", 1)[1] for name in counts if "." in name}


def count_flops(run) -> FlopCount:
    """The FLOPs of ``run()`` (a callable doing forward and maybe backward)."""
    counter = FlopCounter()
    counter.start()
    try:
        run()
    finally:
        counted = counter.stop()
    return counted

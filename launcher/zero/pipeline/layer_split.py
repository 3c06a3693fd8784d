"""How a pipeline's layers split into stages: pure functions over per-layer weights.

A partition is DeepSpeed's boundary list ``parts`` of ``num_stages + 1`` ints: stage ``s`` owns
layers ``parts[s]:parts[s + 1]``.
"""
from __future__ import annotations

import re

from launcher.zero.errors import ConfigError
from launcher.zero.layout.partition_math import partition_uniform


def partition_balanced(weights: list[float], num_parts: int) -> list[int]:
    """Contiguous parts whose heaviest and lightest weights are as close as possible.

    Dynamic programming over (first i items, j parts), minimising max - min of the part weights;
    among equal splits the later boundary wins (what DeepSpeed's balanced split gives).
    """
    n = len(weights)
    if n <= num_parts:
        return partition_uniform(n, num_parts)
    prefix = [0.0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    inf = float("inf")
    # best[j][i] = (cost, heaviest, lightest, previous boundary) for the first i items in j parts
    best = [[(inf, inf, inf, 0)] * (n + 1) for _ in range(num_parts + 1)]
    best[0][0] = (0.0, 0.0, inf, 0)
    for j in range(1, num_parts + 1):
        for i in range(j, n + 1):
            chosen = best[j][i]
            for k in range(j - 1, i):
                cost_k, heavy_k, light_k, _ = best[j - 1][k]
                if cost_k == inf:
                    continue
                part = prefix[i] - prefix[k]
                heavy, light = max(heavy_k, part), min(light_k, part)
                if heavy - light <= chosen[0]:
                    chosen = (heavy - light, heavy, light, k)
            best[j][i] = chosen
    parts = [n]
    for j in range(num_parts, 0, -1):
        parts.append(best[j][parts[-1]][3])
    return parts[::-1]


def layer_weights(method: str, param_counts: list[int], type_names: list[str]) -> list[float] | None:
    """The per-layer weights of a partition method (None for ``uniform``)."""
    lowered = method.lower()
    if lowered == "uniform":
        return None
    if lowered == "parameters":
        return [float(count) for count in param_counts]
    if lowered.startswith("type:"):
        pattern = method[len("type:"):]
        try:
            regex = re.compile(pattern, re.IGNORECASE)
        except re.error as error:
            raise ConfigError(f"partition_method '{method}': bad regular expression ({error})", hint=None) from None
        weights = [1.0 if regex.search(name) else 0.0 for name in type_names]
        if not any(weights):
            raise ConfigError(f"partition_method '{method}': no layer's type matches '{pattern}'",
                              hint=f"layer types are {sorted(set(type_names))}")
        return weights
    raise ConfigError(f"partition_method '{method}' is not one of uniform, parameters, type:<regex>",
                      hint='partition_method="parameters"')


def partition_layers(method: str, num_stages: int, param_counts: list[int], type_names: list[str]) -> list[int]:
    """The stage boundaries for ``method`` over layers with these parameter counts and type names."""
    weights = layer_weights(method, param_counts, type_names)
    if weights is None:
        return partition_uniform(len(param_counts), num_stages)
    return partition_balanced(weights, num_stages)

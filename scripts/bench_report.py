"""bench_engine.py's report beyond tokens/s (issue 32): MFU, compiled variants against
plain_compile, each step's loss beside DeepSpeed's, the phases of a step, dynamo's graph breaks
and where the memory sits per parameter. Pure functions over the workers' JSON records."""
from __future__ import annotations

import math


def base_name(label: str) -> str:
    return label.split("#")[0]


def round_figure(value: float | None, decimals: int, significant: int = 3) -> float | None:
    """``round(value, decimals)``, with more decimals where that would keep fewer than
    ``significant`` digits: a CPU's 0.004 TFLOP/s stays 0.004, not a misleading 0.0. A GPU's
    figures (hundreds of TFLOP/s, MFU in tenths) round exactly as ``round(value, decimals)``."""
    if value is None or value == 0 or not math.isfinite(value):
        return value
    return round(value, max(decimals, significant - 1 - math.floor(math.log10(abs(value)))))


def measured(value) -> bool:
    """A positive finite figure: what a rate can be divided by."""
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def mfu(tflops: float | None, peak_tflops: float | None, decimals: int = 6) -> float | None:
    """Model TFLOP/s over the measured matrix-product peak; None (not measured) without a
    positive peak or without the model's figure."""
    if not measured(peak_tflops) or tflops is None or not math.isfinite(tflops):
        return None
    return round_figure(tflops / peak_tflops, decimals)


def format_mfu(value: float | None) -> str:
    """``MFU 41.3%``; three significant digits below 0.1% (a CPU), never a misleading 0.0%."""
    if value is None:
        return "MFU not measured"
    return f"MFU {value:.1%}" if value == 0 or value >= 1e-3 else f"MFU {100 * value:.3g}%"


def add_mfu(results: list[dict], peak_tflops: float | None) -> list[dict]:
    """Each ok result with ``mfu``: its model TFLOP/s over the measured matrix-product peak (None
    where the peak was not measured), and a compiled variant's ``ratio_vs_plain_compile``
    (tokens/s over the first plain_compile run)."""
    base = next((r for r in results if r["variant"] == "plain_compile" and r["status"] == "ok"), None)
    out = []
    for r in results:
        r = dict(r)
        if r["status"] == "ok":
            r["mfu"] = mfu(r.get("tflops"), peak_tflops)
            if base is not None and "compile" in r["variant"]:
                r["ratio_vs_plain_compile"] = round(r["tokens_per_s"] / base["tokens_per_s"], 4)
        out.append(r)
    return out


def trace_costs(tokens_per_s: dict[str, float], twins: dict[str, str]) -> dict[str, float]:
    """The inf/NaN trace's step cost per traced variant: 1 - its tokens/s over its ``_nantrace_off``
    twin's (``twins``: off -> on), where both ran."""
    return {on: round(1.0 - tokens_per_s[on] / tokens_per_s[off], 4) for off, on in twins.items()
            if measured(tokens_per_s.get(on)) and measured(tokens_per_s.get(off))}


def add_trace_cost(results: list[dict], twins: dict[str, str]) -> list[dict]:
    """Each ok first run of a traced variant whose trace-off twin ran too, with ``trace_cost`` and
    ``trace_off_twin`` (zero2_nantrace beside zero2_nantrace_off: 0.012 is a 1.2% slower step)."""
    first = {r["variant"]: r["tokens_per_s"] for r in results if r["status"] == "ok" and "#" not in r["variant"]}
    costs = trace_costs(first, twins)
    off_of = {on: off for off, on in twins.items()}
    return [dict(r, trace_cost=costs[r["variant"]], trace_off_twin=off_of[r["variant"]])
            if r["variant"] in costs and r["status"] == "ok" else r for r in results]


def format_trace_costs(rows: list[dict], key: str = "trace_cost") -> str:
    return "\n".join(f"[trace] {r['variant']}: the inf/NaN trace costs {100 * r[key]:.2f}% of a step "
                     f"(tokens/s vs {r['trace_off_twin']})" for r in rows if key in r)


def bf16_step(value: float) -> float:
    """The spacing of bf16 numbers at ``value`` (8 significant bits): one bf16 step."""
    if value == 0 or not math.isfinite(value):
        return 0.0
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7)


def loss_comparison(results: list[dict], twins: dict[str, str]) -> list[dict]:
    """For each of our variants whose DeepSpeed twin ran too (first runs only): the per-step
    losses side by side, the largest difference, and whether every step is within one bf16 step
    of DeepSpeed's loss."""
    first = {}
    for r in results:
        if r["status"] == "ok" and "#" not in r["variant"] and r.get("losses"):
            first[r["variant"]] = r
    rows = []
    for ours, theirs in twins.items():
        if ours in first and theirs in first:
            a, b = first[ours]["losses"], first[theirs]["losses"]
            diffs = [abs(x - y) for x, y in zip(a, b)]
            rows.append({"loss_comparison": True, "variant": ours, "deepspeed": theirs, "ours": a,
                         "theirs": b, "max_abs_diff": round(max(diffs), 6),
                         "within_bf16_step": all(d <= bf16_step(y) for d, y in zip(diffs, b))})
    return rows


def format_losses(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        pairs = " ".join(f"{a:.4f}/{b:.4f}" for a, b in zip(row["ours"], row["theirs"]))
        lines.append(f"[loss] {row['variant']} vs {row['deepspeed']}: max diff {row['max_abs_diff']:.5f} "
                     f"({'within' if row['within_bf16_step'] else 'NOT within'} one bf16 step)  ours/theirs {pairs}")
    return "\n".join(lines)


def format_details(results: list[dict]) -> str:
    """Per ok first run: MFU, the phases (device and host ms), compile counts, bytes/param."""
    lines = []
    for r in results:
        if r["status"] != "ok" or "#" in r["variant"]:
            continue
        parts = []
        if "mfu" in r:
            parts.append(format_mfu(r["mfu"]))
        if "ratio_vs_plain_compile" in r:
            parts.append(f"vs plain_compile {r['ratio_vs_plain_compile']:.3f}")
        phases = r.get("phases_ms") or {}
        if phases:
            parts.append("phases ms device/host " + " ".join(
                f"{p} {phases.get(p + '_device', float('nan')):.1f}/{phases.get(p + '_host', float('nan')):.1f}"
                for p in ("forward", "backward", "step")))
        if "compile" in r:
            c = r["compile"]
            skipped = f" frames skipped {c['frames_skipped']}" if c.get("frames_skipped") else ""
            parts.append(f"graphs {c['unique_graphs']} breaks {c['graph_breaks']} recompiles {c['recompiles']}"
                         f"{skipped} first step {r.get('first_step_s', 0):.1f}s")
        if "bytes" in r:
            b = r["bytes"]
            parts.append("B/param host rss {0} (peak {1}) tensors {2}+{3} pinned, gpu {4} (peak {5})".format(
                b.get("host_rss_bytes_per_param"), b.get("host_peak_rss_bytes_per_param"),
                b.get("host_tensor_bytes_per_param"), b.get("host_pinned_tensor_bytes_per_param"),
                b.get("gpu_allocated_bytes_per_param", "-"), b.get("gpu_peak_bytes_per_param", "-")))
        if parts:
            lines.append(f"[detail] {r['variant']}: " + "; ".join(parts))
    return "\n".join(lines)


def summary_extras(rows: list[dict], results: list[dict], peak_tflops: float | None) -> list[dict]:
    """Repeat summaries plus MFU of the median run (None where the peak was not measured) and the
    median's ratio to plain_compile's."""
    flops_per_token = {}
    for r in results:
        if r["status"] == "ok" and r.get("tokens_per_s"):
            flops_per_token[base_name(r["variant"])] = r["tflops"] * 1e12 / r["tokens_per_s"]
    medians = {row["variant"]: row["tokens_per_s_median"] for row in rows}
    out = []
    for row in rows:
        row = dict(row)
        name = row["variant"]
        if name in flops_per_token:
            row["mfu"] = mfu(row["tokens_per_s_median"] * flops_per_token[name] / 1e12, peak_tflops, 4)
        if "compile" in name and medians.get("plain_compile"):
            row["ratio_vs_plain_compile"] = round(row["tokens_per_s_median"] / medians["plain_compile"], 4)
        out.append(row)
    return out

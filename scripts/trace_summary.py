#!/usr/bin/env python3
"""What a torch.profiler Chrome trace says about where the time went, as a few lines of text.

Reads a trace written by ``scripts/trace_steps.py`` (``.json`` or ``.json.gz``) and prints:

* the GPU: how much of the traced window the kernels kept it busy, the copies host-to-device and
  device-to-host, and the longest idle gaps between kernels (where the GPU waited for the host);
* the host: how long the host sat in synchronizing CUDA calls, and per thread (main, autograd,
  the background step's worker) its busy time and the operators that took most of it.

    python scripts/trace_summary.py out/z2o.json.gz [--gap-us 50] [--top 8] [--json]

Times are in milliseconds. An operator's time is inclusive (it counts the operators it calls),
and only the outermost operators of a thread add up to that thread's busy time.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaStreamWaitEvent")


def union(intervals) -> list[tuple[float, float]]:
    """The intervals (start, end) merged where they overlap or touch, in order."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def covered(intervals) -> float:
    """Total length of the union of the intervals."""
    return sum(b - a for a, b in union(intervals))


def gaps(intervals, at_least: float) -> list[tuple[float, float]]:
    """The holes of at least ``at_least`` between the merged intervals, as (start, length)."""
    merged = union(intervals)
    return [(a_end, b_start - a_end) for (_, a_end), (b_start, _) in zip(merged, merged[1:])
            if b_start - a_end >= at_least]


def outermost(events) -> list[dict]:
    """The events of one thread that no other event of that thread contains."""
    out, end = [], float("-inf")
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):   # a parent before what it contains
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def _copy_direction(name: str) -> str:
    for key in ("HtoD", "DtoH", "DtoD", "HtoH"):
        if key in name:
            return key
    return "other"


def summarize(events: list[dict], gap_us: float = 50.0, top: int = 8) -> dict:
    """The figures above, from a trace's ``traceEvents`` (all times in ms)."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    if not spans:
        return {"window_ms": 0.0, "gpu": None, "host_waits_ms": {}, "threads": []}
    first = min(e["ts"] for e in spans)
    window = max(e["ts"] + e["dur"] for e in spans) - first
    gpu = [e for e in spans if e.get("cat") in GPU_CATEGORIES]
    result: dict = {"window_ms": window / 1e3, "gpu": None}
    if gpu:
        kernels = [(e["ts"], e["ts"] + e["dur"]) for e in gpu if e["cat"] == "kernel"]
        copies: dict[str, list] = defaultdict(list)
        for e in gpu:
            if e["cat"] == "gpu_memcpy":
                copies[_copy_direction(e["name"])].append((e["ts"], e["ts"] + e["dur"]))
        holes = sorted(gaps(kernels, gap_us), key=lambda g: -g[1])
        result["gpu"] = {
            "kernels": len(kernels),
            "kernel_busy_ms": covered(kernels) / 1e3,
            "any_busy_ms": covered((e["ts"], e["ts"] + e["dur"]) for e in gpu) / 1e3,
            "copies_ms": {k: covered(v) / 1e3 for k, v in sorted(copies.items())},
            "gaps_over_us": gap_us,
            "gaps": len(holes),
            "gaps_ms": sum(length for _, length in holes) / 1e3,
            "longest_gaps": [{"at_ms": (start - first) / 1e3, "ms": length / 1e3} for start, length in holes[:top]],
        }
    waits: dict[str, float] = defaultdict(float)
    for e in spans:
        if e.get("cat") == "cuda_runtime" and e.get("name") in HOST_WAITS:
            waits[e["name"]] += e["dur"] / 1e3
    result["host_waits_ms"] = dict(sorted(waits.items()))
    by_thread: dict = defaultdict(list)
    for e in spans:
        if e.get("cat") in ("cpu_op", "user_annotation", "python_function"):
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    threads = []
    for (pid, tid), ops in by_thread.items():
        outer = outermost(ops)
        per_name: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for e in outer:
            per_name[e["name"]][0] += 1
            per_name[e["name"]][1] += e["dur"] / 1e3
        ranked = sorted(per_name.items(), key=lambda kv: -kv[1][1])[:top]
        threads.append({"tid": tid, "busy_ms": covered((e["ts"], e["ts"] + e["dur"]) for e in outer) / 1e3,
                        "ops": len(ops), "top": [{"name": n, "calls": c, "ms": ms} for n, (c, ms) in ranked]})
    result["threads"] = sorted(threads, key=lambda t: -t["busy_ms"])
    return result


def format_summary(s: dict) -> str:
    lines = [f"traced window {s['window_ms']:.1f} ms"]
    g = s["gpu"]
    if g is None:
        lines.append("GPU: no kernel or copy events in this trace (a CPU run?)")
    else:
        share = g["kernel_busy_ms"] / s["window_ms"] if s["window_ms"] else 0.0
        copies = ", ".join(f"{k} {v:.1f}" for k, v in g["copies_ms"].items()) or "none"
        lines.append(f"GPU: {g['kernels']} kernels, busy {g['kernel_busy_ms']:.1f} ms ({share:.0%} of the window), "
                     f"with copies {g['any_busy_ms']:.1f} ms; copies ms: {copies}")
        lines.append(f"GPU idle between kernels: {g['gaps']} gaps of >= {g['gaps_over_us']:g} us, "
                     f"{g['gaps_ms']:.1f} ms in all; longest: "
                     + (", ".join(f"{x['ms']:.2f} at {x['at_ms']:.1f}" for x in g["longest_gaps"]) or "none"))
    waits = ", ".join(f"{k} {v:.1f}" for k, v in s["host_waits_ms"].items())
    lines.append(f"host waits for the GPU (ms): {waits or 'none traced'}")
    for t in s["threads"]:
        lines.append(f"thread {t['tid']}: busy {t['busy_ms']:.1f} ms in {t['ops']} operators; outermost by time:")
        lines.extend(f"    {x['ms']:9.2f} ms {x['calls']:6d}x  {x['name']}" for x in t["top"])
    return "\n".join(lines)


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        data = json.load(handle)
    return data["traceEvents"] if isinstance(data, dict) else data


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace", help="a Chrome trace, .json or .json.gz")
    p.add_argument("--gap-us", type=float, default=50.0, help="count GPU idle gaps at least this long")
    p.add_argument("--top", type=int, default=8, help="operators per thread, and gaps, to list")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON document instead")
    args = p.parse_args(argv)
    try:
        events = load(args.trace)
    except (OSError, ValueError, KeyError, EOFError) as err:
        print(f"trace_summary: cannot read {args.trace}: {err}", file=sys.stderr)
        return 2
    summary = summarize(events, args.gap_us, args.top)
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Training-step benchmark of issue 7: plain PyTorch against our ZeRO stages, FSDP2, DeepSpeed.

Each variant runs in its own process (world size 1) and prints one JSON line; this parent
adds each line's ratio to plain PyTorch measured in the same run and prints it on stdout.
A short table goes to stderr. On a machine without CUDA it runs on the CPU (use --tiny).

    python scripts/bench_engine.py                      # issue 7's 406M GPT, all variants
    python scripts/bench_engine.py --tiny --variants plain,fsdp2,zero2
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_VARIANTS = ("plain,fsdp2,zero0,zero1,zero2,zero3,zero2_offload,zero3_offload,"
                    "zero2_offload_overlap,zero3_offload_overlap,"
                    "ds_zero0,ds_zero1,ds_zero2,ds_zero3,ds_zero2_offload")
TIMING_KEYS = ("step_ms_median", "step_ms_min", "tokens_per_s", "tflops", "peak_mem_gib")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The benchmark GPT's shape and batch (issue 7's 406M model by default)."""
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=16)


def device_and_model_config(args):
    """The first GPU (made current) or the CPU, and the GPTConfig of ``add_model_args``'s values."""
    import torch

    sys.path[:0] = [p for p in (HERE, REPO) if p not in sys.path]
    from tests.helpers.gpt import GPTConfig

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return device, GPTConfig(n_layer=args.layers, n_embd=args.width, n_head=args.heads,
                             seq_len=args.seq, vocab_size=args.vocab)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default=DEFAULT_VARIANTS,
                   help="comma-separated; a name given twice is timed twice (plain,...,plain)")
    add_model_args(p)
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 turns clipping off")
    p.add_argument("--tiny", action="store_true",
                   help="2 layers, width 64, seq 64, vocab 512, batch 2, 1+3 steps (CPU test)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per variant")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the variant list N times, interleaved (a,b,a,b,...), and report medians")
    p.add_argument("--log-dir", help="write each variant's stderr to LOG_DIR/<variant>.log")
    p.add_argument("--profile", metavar="DIR",
                   help="after timing, profile 3 steps: DIR/<variant>.txt (top kernels by GPU time)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one variant here
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.width, args.heads, args.seq, args.vocab = 2, 64, 4, 64, 512
        args.batch, args.warmup, args.steps = 2, 1, 3
    return args


# ---------------------------------------------------------------- parent: pure helpers

def with_ratios(results: list[dict], targets: dict[str, float]) -> list[dict]:
    """Each result plus its tokens/s and peak-memory ratios to the first plain run."""
    base = next((r for r in results if r["variant"] == "plain" and r["status"] == "ok"), None)
    out = []
    for r in results:
        r = dict(r)
        name = r["variant"].split("#")[0]
        if r["status"] == "ok" and base is not None:
            r["ratio_vs_plain"] = round(r["tokens_per_s"] / base["tokens_per_s"], 4)
            if r.get("peak_mem_gib") is not None and base.get("peak_mem_gib"):
                r["mem_vs_plain"] = round(r["peak_mem_gib"] / base["peak_mem_gib"], 4)
            if name in targets:
                r["target_ratio"] = targets[name]
                r["meets_target"] = (r["ratio_vs_plain"] >= targets[name]
                                     and r.get("mem_vs_plain", 0.0) <= 1.0)
        out.append(r)
    return out


def summarize_repeats(results: list[dict], targets: dict[str, float]) -> list[dict]:
    """Per variant over its repeats: the median of the runs' tokens/s, their spread, and the
    ratio of that median to plain's median (each run's own figure is a median of its steps)."""
    by_name: dict[str, list[dict]] = {}
    for r in results:
        by_name.setdefault(r["variant"].split("#")[0], []).append(r)
    medians = {}
    for name, runs in by_name.items():
        ok = [r["tokens_per_s"] for r in runs if r["status"] == "ok"]
        if ok:
            medians[name] = (statistics.median(ok), min(ok), max(ok), len(ok), len(runs))
    base = medians.get("plain")
    out = []
    for name, (median, low, high, ok, runs) in medians.items():
        row = {"variant": name, "runs_ok": ok, "runs": runs, "tokens_per_s_median": round(median, 1),
               "tokens_per_s_min": round(low, 1), "tokens_per_s_max": round(high, 1),
               "spread": round((high - low) / median, 4)}
        peaks = [r["peak_mem_gib"] for r in by_name[name] if r.get("peak_mem_gib") is not None]
        if peaks:
            row["peak_mem_gib"] = max(peaks)
        if base is not None:
            row["ratio_vs_plain"] = round(median / base[0], 4)
            if name in targets:
                row["target_ratio"] = targets[name]
                row["meets_target"] = row["ratio_vs_plain"] >= targets[name]
        out.append(row)
    return out


def label_repeats(names: list[str]) -> list[str]:
    """plain,zero1,plain -> plain,zero1,plain#2: repeated variants get distinct labels."""
    seen: dict[str, int] = {}
    labels = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return labels


def last_json_line(text: str) -> dict | None:
    """The last stdout line that is a JSON object with a 'variant' key."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "variant" in record:
                return record
    return None


def format_table(results: list[dict]) -> str:
    """One human-readable row per variant; the name column is as wide as the longest label."""
    w = max([len("variant")] + [len(r["variant"]) for r in results]) + 2
    rows = [f"{'variant':<{w}}{'status':<12}{'median ms':>10}{'min ms':>9}{'tok/s':>10}"
            f"{'TFLOP/s':>9}{'peak GiB':>9}{'ratio':>7}{'mem':>6}  target"]
    for r in results:
        if r["status"] != "ok":
            rows.append(f"{r['variant']:<{w}}{r['status']:<12}{r.get('reason', '')[:90]}")
            continue
        target = ("" if "target_ratio" not in r else
                  f">={r['target_ratio']} {'met' if r['meets_target'] else 'MISSED'}")
        mem = r.get("peak_mem_gib")
        rows.append(
            f"{r['variant']:<{w}}{'ok':<12}{r['step_ms_median']:>10.2f}{r['step_ms_min']:>9.2f}"
            f"{r['tokens_per_s']:>10.0f}{r['tflops']:>9.1f}"
            f"{('-' if mem is None else f'{mem:.2f}'):>9}"
            f"{r.get('ratio_vs_plain', float('nan')):>7.3f}{r.get('mem_vs_plain', float('nan')):>6.2f}"
            f"  {target}")
    return "\n".join(rows)


# ---------------------------------------------------------------- parent: processes

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(base: dict[str, str]) -> dict[str, str]:
    """A world-size-1 rendezvous on 127.0.0.1 with a free port, for one variant's process."""
    env = dict(base)
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, base.get("PYTHONPATH")) if p)
    return env


def run_variant(name: str, label: str, argv: list[str], args) -> dict:
    """Start one worker process for a variant and return its JSON record."""
    cmd = [sys.executable, "-u", os.path.abspath(__file__), *argv, "--worker", name]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=worker_env(dict(os.environ)), capture_output=True,
                              text=True, timeout=args.timeout)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        rc = None
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
        with open(os.path.join(args.log_dir, f"{label.replace('#', '_')}.log"), "w") as f:
            f.write(stderr)
    record = last_json_line(stdout)
    if record is None:
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        why = f"timed out after {args.timeout:.0f}s" if rc is None else f"exit code {rc}"
        record = {"variant": name, "status": "error", "reason": f"{why}: {tail}"}
    record["variant"] = label
    record["wall_s"] = round(time.monotonic() - started, 1)
    return record


def main_parent(args, argv: list[str]) -> int:
    sys.path.insert(0, HERE)
    from bench_variants import TARGETS, VARIANTS

    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    names = names * max(1, args.repeat)   # interleaved: a,b,c,a,b,c,...
    results = []
    for name, label in zip(names, label_repeats(names)):
        results.append(run_variant(name, label, argv, args))
        print(f"[bench] {label}: {results[-1]['status']} ({results[-1]['wall_s']}s)",
              file=sys.stderr, flush=True)
    for record in with_ratios(results, TARGETS):
        print(json.dumps(record), flush=True)
    print(format_table(with_ratios(results, TARGETS)), file=sys.stderr)
    if args.repeat > 1:
        summary = summarize_repeats(results, TARGETS)
        w = max(len(row["variant"]) for row in summary) if summary else 0
        for row in summary:
            print(json.dumps({"summary": True, **row}), flush=True)
            print(f"[median of {row['runs_ok']}] {row['variant']:<{w}} {row['tokens_per_s_median']:>10.0f} tok/s "
                  f"(spread {row['spread']:.1%}) ratio {row.get('ratio_vs_plain', float('nan')):.3f}"
                  + (f" target >={row['target_ratio']} {'met' if row['meets_target'] else 'MISSED'}"
                     if "target_ratio" in row else ""), file=sys.stderr)
    return 0 if all(r["status"] != "error" for r in results) else 1


# ---------------------------------------------------------------- worker: one variant

def main_worker(args) -> int:
    import torch

    sys.path[:0] = [HERE, REPO]
    from tests.helpers.gpt import GPT, flops_per_token
    from bench_variants import VARIANTS, Settings, Unavailable

    name = args.worker
    device, config = device_and_model_config(args)
    cuda = device.type == "cuda"
    common = {"variant": name, "batch": args.batch, "seq": args.seq, "layers": args.layers,
              "width": args.width, "warmup": args.warmup, "steps": args.steps,
              "torch": torch.__version__,
              "device": torch.cuda.get_device_name(device) if cuda else "cpu"}

    def emit(record: dict) -> int:
        print(json.dumps({**common, **record}), flush=True)
        return 0

    torch.manual_seed(0)
    with torch.device(device):
        model = GPT(config)
    common["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 2)
    settings = Settings(batch=args.batch, device=device, grad_clip=args.grad_clip)
    try:
        step = VARIANTS[name](model, settings)
    except Unavailable as exc:
        return emit({"status": "unavailable", "reason": str(exc)})
    except Exception as exc:
        traceback.print_exc()
        return emit({"status": "error", "reason": f"setup: {type(exc).__name__}: {exc}"[:500]})

    # Several random batches, rotated, so no step sees cached or all-zero data.
    gen = torch.Generator(device=device).manual_seed(1)
    batches = []
    for _ in range(4):
        tokens = torch.randint(0, config.vocab_size, (args.batch, config.seq_len + 1),
                               device=device, generator=gen)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    try:
        times_ms, losses = time_steps(step, batches, args.warmup, args.steps, device)
    except Exception as exc:
        traceback.print_exc()
        return emit({"status": "error", "reason": f"step: {type(exc).__name__}: {exc}"[:500]})

    if args.profile:
        profile_steps(step, batches, device, os.path.join(args.profile, f"{name}.txt"))
    median = statistics.median(times_ms)
    tokens = args.batch * config.seq_len
    return emit({
        "status": "ok",
        "step_ms_median": round(median, 3), "step_ms_min": round(min(times_ms), 3),
        "step_ms_max": round(max(times_ms), 3),
        "tokens_per_s": round(tokens / median * 1e3, 1),
        "tflops": round(flops_per_token(config) * tokens / median / 1e9, 2),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if cuda else None,
        "peak_reserved_gib": (round(torch.cuda.max_memory_reserved(device) / 2**30, 3)
                              if cuda else None),
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
    })


def time_steps(step, batches, warmup: int, steps: int, device) -> tuple[list[float], list[float]]:
    """Run warm-up then timed steps; per-step times in ms (CUDA events on GPU)."""
    import torch

    cuda = device.type == "cuda"
    losses, marks = [], []
    for i in range(warmup + steps):
        idx, targets = batches[i % len(batches)]
        if i >= warmup:
            start = torch.cuda.Event(enable_timing=True) if cuda else time.perf_counter()
            if cuda:
                start.record()
        loss = step(idx, targets)
        losses.append(loss.detach())
        if i >= warmup:
            if cuda:
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                marks.append((start, end))
            else:
                marks.append((start, time.perf_counter()))
    if cuda:
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) for s, e in marks]
    else:
        times = [(e - s) * 1e3 for s, e in marks]
    return times, [float(x) for x in losses]


def profile_steps(step, batches, device, path: str, steps: int = 3) -> None:
    """torch.profiler over a few steps: the table of kernels by GPU time, and busy vs wall."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        for i in range(steps):
            step(*batches[i % len(batches)])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    wall_ms = (time.perf_counter() - started) * 1e3 / steps
    events = prof.key_averages()
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    # kernels and copies only (device-side events); operator rows would count them twice
    busy_us = sum(getattr(e, "self_device_time_total", 0) for e in events
                  if str(getattr(e, "device_type", "")).endswith("CUDA"))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(f"per step: wall {wall_ms:.2f} ms (profiled), GPU kernel time "
                f"{busy_us / 1e3 / steps:.2f} ms\n")
        f.write(events.table(sort_by=sort, row_limit=30, max_name_column_width=70))
        if device.type == "cuda":   # where the host's time goes (offload steps are host-bound)
            f.write("\nby self CPU time:\n")
            f.write(events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=70))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.worker:
        try:
            return main_worker(args)
        finally:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
    return main_parent(args, [a for a in argv if a != "--worker"])


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Training-step benchmark of issues 7 and 32: plain PyTorch against our ZeRO stages, FSDP2, DeepSpeed.

Each variant runs in its own process (world size 1, bench_worker.py) and prints one JSON line;
this parent adds each line's ratio to plain PyTorch (and a compiled variant's to plain_compile)
measured in the same run, the MFU (model FLOPs over the card's bf16 matrix-product rate, measured
first in the same run), and each variant's per-step losses beside DeepSpeed's for the same config,
and prints it on stdout. A short table goes to stderr. Without CUDA it runs on the CPU (--tiny).

    python scripts/bench_engine.py                      # issue 7's 406M GPT, all variants
    python scripts/bench_engine.py --tiny --variants plain,fsdp2,zero2
    python scripts/bench_engine.py --model llama --batch 8 --variants plain,zero3,ds_zero3
    python scripts/bench_engine.py --model moe --batch 8 --variants plain,zero2,ds_zero2
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_VARIANTS = ("plain,fsdp2,zero0,zero1,zero2,zero3,zero2_offload,zero3_offload,"
                    "zero2_offload_overlap,zero3_offload_overlap,"
                    "ds_zero0,ds_zero1,ds_zero2,ds_zero3,ds_zero2_offload")
TIMING_KEYS = ("step_ms_median", "step_ms_min", "tokens_per_s", "tflops", "peak_mem_gib")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The benchmark model and batch (issue 7's 406M GPT by default; ``--model llama``: a 1.24B
    Hugging Face Llama built from a config)."""
    p.add_argument("--model", choices=("gpt", "llama", "qwen2", "moe"), default="gpt",
                   help="moe: the GPT with an MoE layer every other block (bench_moe.py)")
    p.add_argument("--llama", choices=("1b", "tiny"), default="1b", help="the Llama config (--model llama)")
    p.add_argument("--grad-ckpt", action="store_true",
                   help="activation checkpointing by the model's gradient_checkpointing_enable() (llama)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--experts", type=int, default=8, help="experts per MoE layer (--model moe)")
    p.add_argument("--top-k", type=int, default=2, help="experts per token (--model moe)")


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
    p.add_argument("--budget", type=float, default=0,
                   help="seconds for the whole run: a repeat that would end past it (by the time its "
                        "variant's last run took) is skipped, and the tables cover what ran; first runs "
                        "always run; 0: no limit")
    p.add_argument("--log-dir", help="write each variant's stderr to LOG_DIR/<variant>.log")
    p.add_argument("--profile", metavar="DIR",
                   help="after timing, profile 3 steps: DIR/<variant>.txt (top kernels by GPU time)")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend of the *_compile variants (aot_eager: a CPU check)")
    p.add_argument("--peak-size", type=int, default=8192,
                   help="the bf16 matrix product (N^3) measured first, MFU's denominator; 0: none")
    p.add_argument("--bytes", action="store_true",
                   help="after timing, where the memory sits per parameter (host / GPU)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one variant here
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.width, args.heads, args.seq, args.vocab = 2, 64, 4, 64, 512
        args.batch, args.warmup, args.steps = 2, 1, 3
        args.llama, args.peak_size = "tiny", min(args.peak_size, 256)
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
            f"{r['tokens_per_s']:>10.0f}{format_tflops(r['tflops']):>9}"
            f"{('-' if mem is None else f'{mem:.2f}'):>9}"
            f"{r.get('ratio_vs_plain', float('nan')):>7.3f}{r.get('mem_vs_plain', float('nan')):>6.2f}"
            f"  {target}")
    return "\n".join(rows)


def format_tflops(value: float | None) -> str:
    """One decimal (a GPU's hundreds); three significant digits below 1 (a CPU's 0.004, not 0.0)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value == 0 or abs(value) >= 1 else f"{value:.3g}"


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


def measure_peak(args, argv: list[str]) -> float | None:
    """The card's bf16 matrix-product TFLOP/s, measured in its own process first (MFU's denominator)."""
    if args.peak_size <= 0:
        return None
    record = run_variant("matmul_peak", "matmul_peak", argv, args)
    tflops = record.get("tflops") if record["status"] == "ok" else None
    figure = f"{format_tflops(tflops)} TFLOP/s" if tflops is not None else "not measured (no MFU)"
    print(f"[bench] matmul_peak: {record['status']} {figure} (bf16 {args.peak_size}^3)",
          file=sys.stderr, flush=True)
    print(json.dumps(record), flush=True)
    return tflops


def main_parent(args, argv: list[str]) -> int:
    sys.path.insert(0, HERE)
    import bench_report as report
    from bench_variants import DEEPSPEED_TWIN, TARGETS, TRACE_OFF_TWIN, VARIANTS

    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        print(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    peak = measure_peak(args, argv)
    names = names * max(1, args.repeat)   # interleaved: a,b,c,a,b,c,...
    results = []
    started, last_wall = time.monotonic(), {}
    for name, label in zip(names, label_repeats(names)):
        expected = last_wall.get(name)   # a variant's first run always runs: every variant gets a figure
        if args.budget and expected is not None and time.monotonic() - started + expected > args.budget:
            print(f"[bench] {label}: skipped (budget {args.budget:.0f}s: {time.monotonic() - started:.0f}s "
                  f"spent, this run takes ~{expected:.0f}s)", file=sys.stderr, flush=True)
            continue
        results.append(run_variant(name, label, argv, args))
        last_wall[name] = results[-1]["wall_s"]
        # the record at once (stderr), so a run stopped from outside keeps what it measured
        print(f"[bench] {label}: {results[-1]['status']} ({results[-1]['wall_s']}s) {json.dumps(results[-1])}",
              file=sys.stderr, flush=True)
    final = report.add_trace_cost(report.add_mfu(with_ratios(results, TARGETS), peak), TRACE_OFF_TWIN)
    for record in final:
        print(json.dumps(record), flush=True)
    print(format_table(final), file=sys.stderr)
    print(report.format_details(final), file=sys.stderr)
    if report.format_trace_costs(final):
        print(report.format_trace_costs(final), file=sys.stderr)
    losses = report.loss_comparison(results, DEEPSPEED_TWIN)
    for row in losses:
        print(json.dumps(row), flush=True)
    if losses:
        print(report.format_losses(losses), file=sys.stderr)
    if args.repeat > 1:
        summary = report.summary_extras(summarize_repeats(results, TARGETS), results, peak)
        w = max(len(row["variant"]) for row in summary) if summary else 0
        for row in summary:
            print(json.dumps({"summary": True, **row}), flush=True)
            print(f"[median of {row['runs_ok']}] {row['variant']:<{w}} {row['tokens_per_s_median']:>10.0f} tok/s "
                  f"(spread {row['spread']:.1%}) ratio {row.get('ratio_vs_plain', float('nan')):.3f}"
                  + (f" {report.format_mfu(row['mfu'])}" if "mfu" in row else "")
                  + (f" vs plain_compile {row['ratio_vs_plain_compile']:.3f}" if "ratio_vs_plain_compile" in row else "")
                  + (f" target >={row['target_ratio']} {'met' if row['meets_target'] else 'MISSED'}"
                     if "target_ratio" in row else ""), file=sys.stderr)
        medians = report.trace_costs({row["variant"]: row["tokens_per_s_median"] for row in summary}, TRACE_OFF_TWIN)
        for name, cost in medians.items():
            print(f"[median] {name}: the inf/NaN trace costs {100 * cost:.2f}% of a step", file=sys.stderr)
    return 0 if all(r["status"] != "error" for r in results) else 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.worker:
        sys.path.insert(0, HERE)
        from bench_worker import main_worker

        try:
            return main_worker(args)
        finally:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
    return main_parent(args, [a for a in argv if a != "--worker"])


if __name__ == "__main__":
    sys.exit(main())

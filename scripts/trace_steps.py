#!/usr/bin/env python3
"""Where a training step's time goes: step times, host time per phase, and a Chrome trace.

Runs one variant of ``bench_variants.py`` (world size 1) on the benchmark GPT and prints, per
timed step, the device time of the step (CUDA events) beside the host time spent in forward,
backward and ``step()``. Then it records ``--trace-steps`` steps with torch.profiler (CPU and
CUDA) and writes the Chrome trace, gzipped, for ``scripts/trace_summary.py`` to read.

    python scripts/trace_steps.py --variant zero2_offload_overlap --trace out/z2o.json.gz
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def parse_args(argv=None) -> argparse.Namespace:
    sys.path.insert(0, HERE)
    from bench_engine import add_model_args

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variant", required=True)
    add_model_args(p)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--trace", help="write the profiled steps' Chrome trace here (.json.gz)")
    p.add_argument("--trace-steps", type=int, default=2)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
    sys.path.insert(0, REPO)
    import torch
    from bench_engine import device_and_model_config
    from bench_variants import VARIANTS, Settings
    from tests.helpers.gpt import GPT

    device, config = device_and_model_config(args)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    with torch.device(device):
        model = GPT(config)
    step = VARIANTS[args.variant](model, Settings(batch=args.batch, device=device))
    gen = torch.Generator(device=device).manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (args.batch, config.seq_len + 1), device=device, generator=gen)
    idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    for _ in range(args.warmup):
        step(idx, targets)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    host, marks = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        if cuda:
            begin = torch.cuda.Event(enable_timing=True)
            begin.record()
        step(idx, targets)
        host.append((time.perf_counter() - start) * 1e3)
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            marks.append((begin, end))
    sync()
    device_ms = [b.elapsed_time(e) for b, e in marks] if cuda else host
    print(f"{args.variant}: device step ms median {statistics.median(device_ms):.2f} "
          f"min {min(device_ms):.2f} max {max(device_ms):.2f}; host ms per step(): "
          + " ".join(f"{t:.1f}" for t in host), flush=True)
    if args.trace:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(args.trace_steps):
                step(idx, targets)
            sync()
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(raw)
            os.makedirs(os.path.dirname(os.path.abspath(args.trace)), exist_ok=True)
            with open(raw, "rb") as src, gzip.open(args.trace, "wb") as dst:
                shutil.copyfileobj(src, dst)
        print(f"{args.variant}: trace of {args.trace_steps} steps -> {args.trace}", flush=True)
    print(json.dumps({"variant": args.variant, "device_ms": device_ms, "host_ms": host}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

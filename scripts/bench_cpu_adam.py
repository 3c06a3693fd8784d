#!/usr/bin/env python3
"""Parameters per second of one Adam(W) step on the CPU: our CPUAdam next to torch's.

Usage: python scripts/bench_cpu_adam.py [--params 1e8] [--tensors 200] [--steps 5] [--threads N]
Prints one line per optimizer (and --json for a document). DeepSpeedCPUAdam is measured
when `deepspeed` is importable and its op builds; otherwise the line says why not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from launcher.zero.optim.cpu_adam import CPUAdam  # noqa: E402


def make_params(numel: int, tensors: int, flat: bool):
    """`tensors` fp32 parameters summing to `numel` (a model's shape), or one flat buffer."""
    sizes = [numel] if flat else [numel // tensors + (1 if i < numel % tensors else 0) for i in range(tensors)]
    params = [torch.nn.Parameter(torch.randn(n) * 0.02) for n in sizes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def time_steps(opt, steps: int, warmup: int = 1, extra=None) -> float:
    for _ in range(warmup):
        opt.step(**(extra or {}))
    start = time.perf_counter()
    for _ in range(steps):
        opt.step(**(extra or {}))
    return (time.perf_counter() - start) / steps


def cases(args):
    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    n, t = int(args.params), args.tensors
    yield f"torch.optim.AdamW(foreach=True), {t} tensors", lambda: torch.optim.AdamW(make_params(n, t, False), foreach=True, **kw)
    yield f"torch.optim.AdamW(fused=True), {t} tensors", lambda: torch.optim.AdamW(make_params(n, t, False), fused=True, **kw)
    yield "torch.optim.AdamW(fused=True), 1 flat buffer", lambda: torch.optim.AdamW(make_params(n, t, True), fused=True, **kw)
    for threads in sorted({1, args.threads}):
        yield (f"CPUAdam(threads={threads}), 1 flat buffer",
               lambda threads=threads: CPUAdam(make_params(n, t, True), num_threads=threads, **kw))
    yield (f"CPUAdam(threads={args.threads}) + bf16 copy, 1 flat buffer",
           lambda: CPUAdam(make_params(n, t, True), num_threads=args.threads, **kw))
    for chunk in [int(float(c)) for c in args.chunks.split(",") if c]:
        for threads in sorted({1, args.threads}):
            yield (f"CPUAdam(threads={threads}, chunk={chunk:.1e})",
                   lambda chunk=chunk, threads=threads: CPUAdam(make_params(n, t, True), num_threads=threads,
                                                                chunk_elements=chunk, **kw))
    yield "CPUAdam() defaults, 1 flat buffer", lambda: CPUAdam(make_params(n, t, True), **kw)


def copy_bandwidth(numel: int, steps: int) -> float:
    """Host memory bandwidth as torch sees it: GB/s of c = a + b over fp32 buffers (3 x 4 bytes a value)."""
    a, b, c = torch.randn(numel), torch.randn(numel), torch.empty(numel)
    torch.add(a, b, out=c)
    start = time.perf_counter()
    for _ in range(steps):
        torch.add(a, b, out=c)
    return 12 * numel * steps / (time.perf_counter() - start) / 1e9


def deepspeed_case(args):
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as err:  # noqa: BLE001 - any import failure means "not measurable here"
        return None, f"deepspeed not importable ({type(err).__name__}: {err})"
    try:
        opt = DeepSpeedCPUAdam(make_params(int(args.params), args.tensors, True), lr=1e-3, weight_decay=0.01)
        return opt, None
    except Exception as err:  # noqa: BLE001 - the JIT build of its C++ op can fail in many ways
        return None, f"DeepSpeedCPUAdam did not build ({type(err).__name__}: {str(err)[:200]})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, default=1e8)
    p.add_argument("--tensors", type=int, default=200, help="how many tensors the torch baselines step")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--json", action="store_true")
    p.add_argument("--chunks", default="", help="also CPUAdam with these chunk sizes, e.g. 4e6,1.6e7")
    args = p.parse_args(argv)
    numel = int(args.params)
    results = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, {os.cpu_count()} cores, "
          f"{numel / 1e6:.0f}M fp32 params, {args.steps} timed steps")
    print(f"host memory bandwidth (c = a + b, fp32): {copy_bandwidth(numel, args.steps):.1f} GB/s; "
          "an Adam step moves ~30 bytes a parameter (p, g, m, v read; p, m, v, bf16 copy written)")
    for name, build in cases(args):
        opt = build()
        extra = None
        if "bf16" in name:
            p0 = opt.param_groups[0]["params"][0]
            extra = {"params_16bit": {p0: torch.empty_like(p0, dtype=torch.bfloat16)}}
        seconds = time_steps(opt, args.steps, extra=extra)
        results.append({"optimizer": name, "seconds_per_step": seconds, "params_per_s": numel / seconds})
        del opt
    ds_opt, why = deepspeed_case(args)
    if ds_opt is not None:
        seconds = time_steps(ds_opt, args.steps)
        results.append({"optimizer": "DeepSpeedCPUAdam, 1 flat buffer", "seconds_per_step": seconds,
                        "params_per_s": numel / seconds})
    base = results[0]["params_per_s"]
    for r in results:
        print(f"{r['optimizer']:<48} {r['seconds_per_step'] * 1e3:9.1f} ms/step "
              f"{r['params_per_s'] / 1e6:9.1f} M params/s  {r['params_per_s'] / base:5.2f}x")
    if why:
        print(f"DeepSpeedCPUAdam: not measured: {why}")
    if args.json:
        print(json.dumps({"torch": torch.__version__, "cores": os.cpu_count(), "params": numel,
                          "results": results, "deepspeed": why or "measured"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One benchmark variant in this process (world size 1): bench_engine.py starts it per variant.

It builds the model (bench_models.py), turns it into a training step (bench_variants.py), times
warm-up and timed steps, and prints one JSON line: step times, tokens/s, TFLOP/s, peak memory,
every step's loss, each phase's time (forward, backward, step: device time between CUDA events
queued after each, and host time), dynamo's graph and graph-break counts, and with ``--bytes``
where the memory sits per parameter (host and GPU). ``--worker matmul_peak`` measures the card's
bf16 matrix-product rate instead, the denominator of MFU.
"""
from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PHASES = ("forward", "backward", "step")


def matmul_peak(size: int, device, repeats: int = 10) -> dict:
    """TFLOP/s of a size^3 bf16 matrix product on random data (median of ``repeats`` after 3 warm-ups)."""
    import torch

    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    times = []
    for i in range(3 + repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            started = time.perf_counter()
            a @ b
            seconds = time.perf_counter() - started
        if i >= 3:
            times.append(seconds)
    from bench_report import round_figure

    seconds = statistics.median(times)   # None when the clock saw no time pass: not a rate of 0
    tflops = round_figure(2 * size**3 / seconds / 1e12, 2) if seconds > 0 else None
    return {"variant": "matmul_peak", "status": "ok", "size": size, "tflops": tflops}


def rss_bytes() -> int:
    """This process's resident memory now (pinned host memory included)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def tensor_bytes() -> dict[str, int]:
    """Bytes of every live tensor storage Python can reach, by place: 'gpu', 'host_pinned',
    'host'; each storage counted once (views and aliases share it)."""
    import torch

    seen: set[tuple[str, int]] = set()
    totals = {"gpu": 0, "host_pinned": 0, "host": 0}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.is_meta:
                continue
            storage = obj.untyped_storage()
            key = (str(obj.device), storage.data_ptr())
            if key in seen or storage.nbytes() == 0:
                continue
            seen.add(key)
            place = "gpu" if obj.device.type == "cuda" else ("host_pinned" if obj.is_pinned() else "host")
            totals[place] += storage.nbytes()
        except (RuntimeError, ReferenceError, NotImplementedError):   # a tensor without storage
            continue
    return totals


def bytes_per_param(params: int, rss_start: int, device) -> dict:
    """Where the training state sits, per parameter: the tensors Python reaches (by place), and
    what the process holds (host: resident memory gained since start and its peak; GPU: allocated
    and peak allocated)."""
    import torch

    totals = tensor_bytes()
    out = {f"{k}_tensor_bytes_per_param": round(v / params, 2) for k, v in totals.items()}
    out["host_rss_bytes_per_param"] = round((rss_bytes() - rss_start) / params, 2)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["host_peak_rss_bytes_per_param"] = round((peak_rss - rss_start) / params, 2)
    if device.type == "cuda":
        out["gpu_allocated_bytes_per_param"] = round(torch.cuda.memory_allocated(device) / params, 2)
        out["gpu_peak_bytes_per_param"] = round(torch.cuda.max_memory_allocated(device) / params, 2)
    return out


def main_worker(args) -> int:
    import torch

    sys.path[:0] = [p for p in (HERE, REPO) if p not in sys.path]
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if args.worker == "matmul_peak":
        print(json.dumps(matmul_peak(args.peak_size, device)), flush=True)
        return 0
    import bench_models
    from bench_report import round_figure
    from bench_variants import VARIANTS, Settings, Unavailable

    name = args.worker
    common = {"variant": name, "model": args.model, "batch": args.batch, "seq": args.seq,
              "warmup": args.warmup, "steps": args.steps, "grad_ckpt": args.grad_ckpt,
              "torch": torch.__version__, "device": torch.cuda.get_device_name(device) if cuda else "cpu"}
    if args.model in ("gpt", "moe"):
        common.update(layers=args.layers, width=args.width)
    if args.model == "moe":
        common.update(experts=args.experts, top_k=args.top_k)

    def emit(record: dict) -> int:
        print(json.dumps({**common, **record}), flush=True)
        return 0

    rss_start = rss_bytes()
    torch.manual_seed(0)
    theirs = name.startswith("ds_")   # the MoE model: DeepSpeed's own layer in DeepSpeed's variants
    if args.model == "moe" and theirs and not cuda:
        return emit({"status": "unavailable", "reason": "DeepSpeed variants run on CUDA only"})
    try:
        built = bench_models.build(args.model, args, device, deepspeed_layer=theirs)
    except ImportError as exc:
        return emit({"status": "unavailable", "reason": f"model {args.model}: {exc}"})
    common["params_m"] = round(built.params / 1e6, 2)
    settings = Settings(batch=args.batch, device=device, grad_clip=args.grad_clip,
                        compile_backend=args.compile_backend)
    try:
        if args.grad_ckpt:
            bench_models.enable_checkpointing(built)
        step = VARIANTS[name](built.module, settings)
    except Unavailable as exc:
        return emit({"status": "unavailable", "reason": str(exc)})
    except Exception as exc:
        traceback.print_exc()
        return emit({"status": "error", "reason": f"setup: {type(exc).__name__}: {exc}"[:500]})

    # Several random batches, rotated, so no step sees cached or all-zero data.
    gen = torch.Generator(device=device).manual_seed(1)
    batches = []
    for _ in range(4):
        tokens = torch.randint(0, built.vocab_size, (args.batch, built.seq_len + 1), device=device, generator=gen)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    started = time.perf_counter()
    try:
        timing = time_steps(step, batches, args.warmup, args.steps, device)
    except Exception as exc:
        traceback.print_exc()
        return emit({"status": "error", "reason": f"step: {type(exc).__name__}: {exc}"[:500]})
    steps_s = time.perf_counter() - started

    if args.profile:
        profile_steps(step, batches, device, os.path.join(args.profile, f"{name}.txt"))
    times_ms = timing["step_ms"]
    median = statistics.median(times_ms)
    tokens = args.batch * built.seq_len
    record = {
        "status": "ok",
        "step_ms_median": round(median, 3), "step_ms_min": round(min(times_ms), 3),
        "step_ms_max": round(max(times_ms), 3),
        "tokens_per_s": round_figure(tokens / median * 1e3, 1),
        "tflops": round_figure(built.flops_per_token * tokens / median / 1e9, 4),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if cuda else None,
        "peak_reserved_gib": (round(torch.cuda.max_memory_reserved(device) / 2**30, 3)
                              if cuda else None),
        "losses": [round(x, 5) for x in timing["losses"]],
        "loss_first": round(timing["losses"][0], 4), "loss_last": round(timing["losses"][-1], 4),
        "phases_ms": timing["phases"], "first_step_s": round(timing["first_step_s"], 2),
        "all_steps_s": round(steps_s, 2),
    }
    if "compile" in name:
        from launcher.zero.engine.compiling import compile_stats

        record["compile"] = compile_stats()
    if args.bytes:
        engine = getattr(step, "engine", None)
        if engine is not None and hasattr(engine, "wait_for_step"):
            engine.wait_for_step()
        record["bytes"] = bytes_per_param(built.params, rss_start, device)
    return emit(record)


def time_steps(step, batches, warmup: int, steps: int, device) -> dict:
    """Warm-up then timed steps: per-step times in ms (CUDA events on GPU), every step's loss,
    each phase's median device and host ms over the timed steps, the first step's seconds."""
    import torch

    cuda = device.type == "cuda"

    def now():
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return (event, time.perf_counter())
        return (None, time.perf_counter())

    losses, records = [], []
    first_step_s = 0.0
    for i in range(warmup + steps):
        idx, targets = batches[i % len(batches)]
        marks = [("start", now())]
        loss = step(idx, targets, mark=lambda phase: marks.append((phase, now())))
        if i == 0:
            if cuda:
                torch.cuda.synchronize(device)
            first_step_s = time.perf_counter() - marks[0][1][1]
        losses.append(loss.detach())
        if i >= warmup:
            records.append(marks)
    if cuda:
        torch.cuda.synchronize(device)
    step_ms, per_phase = [], {f"{p}_{kind}": [] for p in PHASES for kind in ("device", "host")}
    for marks in records:
        (_, (first_event, first_host)), (_, (last_event, last_host)) = marks[0], marks[-1]
        step_ms.append(first_event.elapsed_time(last_event) if cuda else (last_host - first_host) * 1e3)
        for (_, (e0, h0)), (phase, (e1, h1)) in zip(marks, marks[1:]):
            per_phase[f"{phase}_host"].append((h1 - h0) * 1e3)
            per_phase[f"{phase}_device"].append(e0.elapsed_time(e1) if cuda else (h1 - h0) * 1e3)
    phases = {k: round(statistics.median(v), 2) for k, v in per_phase.items() if v}
    return {"step_ms": step_ms, "losses": [float(x) for x in losses], "phases": phases,
            "first_step_s": first_step_s}


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

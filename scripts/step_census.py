#!/usr/bin/env python3
"""Census of the optimizer step (issue 39): every operator one ``engine.step()`` launches, with its
estimated bytes read and written, beside plain PyTorch's step (clip + fused AdamW + zero_grad).

    python scripts/step_census.py --tiny                                 # CPU: plain, zero0-3 (bf16)
    python scripts/step_census.py --tiny --variants zero2 --precision fp16   # loss scaling instead
    python scripts/step_census.py --variants plain,zero1,zero2           # the 406M GPT on the GPU
    python scripts/step_census.py --model llama --llama tiny --tiny

The step phase is what bench_engine.py times as ``step``: from the variant's mark("backward") to
its mark("step") (bench_variants.py). After ``--warmup`` steps, one step runs under a
TorchDispatchMode that records each aten operator with its inputs' shapes and dtypes and an
estimate of the bytes it moves (tensors read + tensors written; views and allocations move
nothing; ``copy_``/``zero_``/``fill_`` and ``out=`` only write their destination; the fused Adam's
grads are written back only when it has a ``grad_scale``). Rows are summed per operator and
signature and shown in bytes per trainable parameter: a row near 6 B/param is one bf16->fp32
pass, 4 one fp32 read, 28-32 the fused AdamW. The next step runs under torch.profiler: each
operator's count and, on CUDA, its device time, plus the host syncs (``aten::_local_scalar_dense``,
device->host copies). Prints figures; it asserts nothing about time. It runs unchanged on CPU and CUDA.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections import defaultdict
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [p for p in (HERE, REPO) if p not in sys.path]

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

#: operators that write their mutable argument without reading it
WRITE_ONLY = {"copy_", "zero_", "fill_", "normal_", "uniform_", "random_"}
#: operators that move no tensor data (allocation, metadata)
NO_DATA = {"empty", "empty_strided", "empty_like", "set_", "resize_", "detach", "lift_fresh",
           "_local_scalar_dense", "is_nonzero", "size", "stride", "record_stream"}
#: a host sync: the device's work must finish before the host reads a value
SYNC_OPS = {"_local_scalar_dense", "is_nonzero", "item"}


def _tensors(value) -> list[torch.Tensor]:
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class OpRecord:
    """One operator call: its name, signature (dtypes and shapes of its tensor inputs), the bytes it
    reads and writes, the most elements any one of its tensor arguments holds (a list: their sum),
    and whether it made the host wait for the device."""

    name: str
    dtypes: str
    shapes: str
    read: int
    written: int
    numel: int
    sync: bool = False


def op_bytes(func, args, kwargs, out) -> tuple[int, int]:
    """(bytes read, bytes written) of one aten call, estimated from its schema (see module docstring)."""
    name = func._schema.name.split("::")[-1]
    if name in NO_DATA or any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
        return 0, 0   # an allocation or a view
    read = written = 0
    fused_adam = name.startswith("_fused_adam")
    scaled = fused_adam and kwargs.get("grad_scale") is not None
    values = dict(zip([a.name for a in func._schema.arguments], args))
    values.update(kwargs)
    for argument in func._schema.arguments:
        tensors = _tensors(values.get(argument.name))
        mutated = argument.alias_info is not None and argument.alias_info.is_write
        if not mutated:
            read += _nbytes(tensors)
        elif argument.name == "out" or name in WRITE_ONLY:
            written += _nbytes(tensors)
        elif fused_adam and argument.name == "grads" and not scaled:
            read += _nbytes(tensors)
        else:
            read += _nbytes(tensors)
            written += _nbytes(tensors)
    if not any(r.alias_info is not None for r in func._schema.returns):
        written += _nbytes(_tensors(out))
    return read, written


def _signature(args, kwargs) -> tuple[str, str, int]:
    """(dtypes, shapes, largest numel) of the tensor arguments; a list shows as [n x shape, ...]."""
    dtypes, shapes, numel = [], [], 0
    for value in list(args) + list(kwargs.values()):
        tensors = _tensors(value)
        if not tensors:
            continue
        names = sorted({str(t.dtype).replace("torch.", "") for t in tensors})
        dtypes.append("/".join(names))
        if torch.is_tensor(value):
            shapes.append(str(list(value.shape)))
        else:
            shapes.append(f"[{len(tensors)} x {list(tensors[0].shape)}...]")
        numel = max(numel, sum(t.numel() for t in tensors))
    return ",".join(dtypes), " ".join(shapes)[:60], numel


class StepCensus(TorchDispatchMode):
    """Records every aten operator run while it is active (OpRecord each)."""

    def __init__(self):
        super().__init__()
        self.records: list[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        read, written = op_bytes(func, args, kwargs, out)
        dtypes, shapes, numel = _signature(args, kwargs)
        to_host = name in ("_to_copy", "copy_") and _copies_to_host(args, kwargs, out)
        self.records.append(OpRecord(name, dtypes, shapes, read, written, numel, sync=name in SYNC_OPS or to_host))
        return out


def _copies_to_host(args, kwargs, out) -> bool:
    inputs = [t for t in _tensors(list(args)) if t.device.type != "cpu"]
    outputs = _tensors(out) + _tensors(args[:1])
    return bool(inputs) and any(t.device.type == "cpu" for t in outputs)


def param_sized(records: list[OpRecord], params: int, share: float = 0.5) -> list[OpRecord]:
    """The calls that touch at least ``share`` of the parameters' elements in one go (a flat
    buffer, a whole list of per-parameter tensors): each is one pass over the parameters."""
    return [r for r in records if r.numel >= share * params and (r.read or r.written)]


@dataclass
class Summary:
    """A census in bytes per parameter: the rows (one per operator and signature) and the totals."""

    variant: str
    params: int
    rows: list[dict] = field(default_factory=list)
    total: float = 0.0
    ops: int = 0
    passes: int = 0
    syncs: int = 0


def summarize(variant: str, records: list[OpRecord], params: int) -> Summary:
    grouped: dict[tuple, list[OpRecord]] = defaultdict(list)
    for r in records:
        grouped[(r.name, r.dtypes, r.shapes if r.numel >= 0.5 * params else "(small)")].append(r)
    rows = []
    for (name, dtypes, shapes), calls in grouped.items():
        moved = sum(c.read + c.written for c in calls)
        rows.append({"op": name, "count": len(calls), "dtypes": dtypes, "shapes": shapes,
                     "read_b_per_param": round(sum(c.read for c in calls) / params, 3),
                     "written_b_per_param": round(sum(c.written for c in calls) / params, 3),
                     "b_per_param": round(moved / params, 3)})
    rows.sort(key=lambda row: -row["b_per_param"])
    total = sum(r.read + r.written for r in records) / params
    return Summary(variant, params, rows, round(total, 3), len(records), len(param_sized(records, params)),
                   sum(r.sync for r in records))


def format_summary(summary: Summary, limit: int) -> str:
    head = (f"== {summary.variant}: {summary.params / 1e6:.2f}M params, {summary.ops} ops, "
            f"{summary.passes} param-sized, {summary.total:.2f} B/param, host syncs {summary.syncs}")
    lines = [head, f"   {'op':<28}{'count':>6}  {'B/param':>8} {'read':>7} {'write':>7}  dtypes / shapes"]
    for row in summary.rows[:limit]:
        lines.append(f"   {row['op']:<28}{row['count']:>6}  {row['b_per_param']:>8.3f} {row['read_b_per_param']:>7.2f} "
                     f"{row['written_b_per_param']:>7.2f}  {row['dtypes'][:40]} {row['shapes']}")
    hidden = summary.rows[limit:]
    if hidden:
        rest = sum(row["b_per_param"] for row in hidden)
        lines.append(f"   ... {len(hidden)} more rows, {rest:.3f} B/param together")
    return "\n".join(lines)


def profiler_table(prof, device: torch.device) -> list[dict]:
    """torch.profiler's operators of the step: count and (CUDA) device ms, top-level aten calls."""
    rows = []
    for event in prof.key_averages():
        if not event.key.startswith("aten::") and not event.key.startswith("cuda"):
            continue
        device_us = getattr(event, "device_time_total", 0) if device.type == "cuda" else 0
        rows.append({"op": event.key, "count": event.count, "device_ms": round(device_us / 1e3, 3),
                     "cpu_ms": round(event.cpu_time_total / 1e3, 3)})
    rows.sort(key=lambda r: (-r["device_ms"], -r["count"]))
    return rows


def _ensure_rendezvous() -> None:
    """World size 1 on 127.0.0.1 (what bench_engine.py's worker_env gives each variant)."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_PORT=str(port))
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                           MASTER_ADDR="127.0.0.1").items():
        os.environ.setdefault(key, value)


def build_step(name: str, module, settings, precision: str):
    """The variant's step (bench_variants.VARIANTS). Our plain ``zeroN`` variants are built here from
    the same engine_config, so that they step torch's fused AdamW on the CPU too (the factory
    fuses it by itself only on CUDA: the CPU census then follows the GPU's path); ``precision``
    "fp16" (loss scaling) or "fp32" instead of "bf16"."""
    from bench_variants import VARIANTS, _engine_step, engine_config

    if not (name[:4] == "zero" and name[4:].isdigit()):
        return VARIANTS[name](module, settings)
    from launcher import zero

    config = engine_config(int(name[4:]), False, settings)
    config["optimizer"]["params"]["fused"] = True
    if precision != "bf16":
        config["bf16"] = {"enabled": False}
    if precision == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 8}
    engine, _, _, _ = zero.initialize(model=module, config=config)
    return _engine_step(engine)


def census_of(step, batches, warmup: int, device: torch.device) -> tuple[list[OpRecord], list[dict]]:
    """Warm-up steps, one step's census (StepCensus), one step under torch.profiler."""
    for i in range(warmup):
        step(*batches[i % len(batches)])
    census = StepCensus()

    def census_mark(phase):
        if phase == "backward":
            _sync(device)
            census.__enter__()
        elif phase == "step":
            census.__exit__(None, None, None)
    step(*batches[warmup % len(batches)], mark=census_mark)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities, record_shapes=True)

    def profile_mark(phase):
        if phase == "backward":
            _sync(device)
            prof.start()
        elif phase == "step":
            _sync(device)
            prof.stop()
    step(*batches[(warmup + 1) % len(batches)], mark=profile_mark)
    return census.records, profiler_table(prof, device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(name: str, args, device: torch.device) -> dict:
    import bench_models
    from bench_variants import Settings

    torch.manual_seed(0)
    built = bench_models.build(args.model, args, device)
    params = sum(p.numel() for p in built.module.parameters() if p.requires_grad)
    settings = Settings(batch=args.batch, device=device, grad_clip=args.grad_clip,
                        compile_backend=args.compile_backend)
    step = build_step(name, built.module, settings, args.precision)
    gen = torch.Generator(device=device).manual_seed(1)
    batches = []
    for _ in range(3):
        tokens = torch.randint(0, built.vocab_size, (args.batch, built.seq_len + 1), device=device, generator=gen)
        batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    records, profiled = census_of(step, batches, args.warmup, device)
    label = name + (f" {args.precision}" if args.precision != "bf16" and name.startswith("zero") else "")
    summary = summarize(label, records, params)
    print(format_summary(summary, args.rows), flush=True)
    for r in records:
        if r.sync:
            print(f"   host sync: {r.name} {r.dtypes} {r.shapes}", flush=True)
    if args.profiler_rows:
        print(f"   torch.profiler ({device.type}): " + ", ".join(
            f"{r['op']} x{r['count']}" + (f" {r['device_ms']}ms" if device.type == "cuda" else "")
            for r in profiled[:args.profiler_rows]), flush=True)
    engine = getattr(step, "engine", None)
    if engine is not None:
        engine.destroy()
    return {"variant": label, "params": params, "b_per_param": summary.total, "ops": summary.ops,
            "param_sized_ops": summary.passes, "host_syncs": summary.syncs, "rows": summary.rows,
            "profiler": profiled}


def parse_args(argv=None) -> argparse.Namespace:
    from bench_engine import add_model_args

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default="plain,zero0,zero1,zero2,zero3")
    add_model_args(p)
    p.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16",
                   help="our zeroN variants' precision (fp16: with loss scaling)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--rows", type=int, default=14, help="census rows printed per variant")
    p.add_argument("--profiler-rows", type=int, default=8, help="torch.profiler operators printed (0: none)")
    p.add_argument("--json", help="write every census to this file")
    p.add_argument("--tiny", action="store_true", help="4 layers, width 128, seq 64, vocab 512, batch 2 (CPU)")
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.width, args.heads, args.seq, args.vocab, args.batch = 4, 128, 4, 64, 512, 2
        args.llama = "tiny"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    _ensure_rendezvous()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    results = [run_variant(name.strip(), args, device) for name in args.variants.split(",") if name.strip()]
    print("\nvariant            B/param  param-sized ops  host syncs")
    for r in results:
        print(f"{r['variant']:<18}{r['b_per_param']:>8.2f}{r['param_sized_ops']:>17}{r['host_syncs']:>12}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One process of the acceptance run (scripts/gpu_accept.py starts it): one engine's cells, in order.

``--engine plain`` runs the plain-PyTorch references, ``ours`` our engine (``launcher.zero``),
``deepspeed`` DeepSpeed; each cell builds a fresh model from the seed (a copy of one CPU template
per model), trains it on the same per-step batches, and appends one JSON line to ``--results``
(a "begin" line first, so the parent can tell which cell a dead or hung process was in). A cell
that raises is recorded as an error and the next one runs; after a CUDA error the process exits
(3) and the parent starts a new one for the cells left. ``--prebuild`` compiles DeepSpeed's CPU
Adam and fused Adam once (the parent runs it in the background while plain PyTorch trains).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import json
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (HERE, os.path.dirname(HERE)) if p not in sys.path]

import torch  # noqa: E402

import accept_models as models  # noqa: E402
from accept_table import engine_mfu  # noqa: E402

LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 6e-4, (0.9, 0.95), 1e-8, 0.1, 1.0
FP16_SCALE_POWER = 12   # fp16's first loss scale, 2**12: the same in the config and the plain reference
PLAIN = ("plain", "plain_split", "plain_autocast", "plain_fp32", "plain_fp16")
ENGINE_VARIANTS = ("zero0", "zero1", "zero2", "zero3", "zero2_fp16", "zero2_offload", "zero3_offload")


def engine_config(variant: str, batch: int, cuda: bool) -> dict:
    """The DeepSpeed config our engine and DeepSpeed both get for a variant (zero<S>[_fp16|_offload])."""
    zero: dict = {"stage": int(variant[4])}
    if "offload" in variant:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
    config = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
              "gradient_clipping": CLIP, "zero_optimization": zero, "steps_per_print": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                        "weight_decay": WEIGHT_DECAY}}}
    if "fp16" in variant:
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": FP16_SCALE_POWER,
                          "hysteresis": 1, "loss_scale_window": 1000, "min_loss_scale": 1}
    else:
        config["bf16"] = {"enabled": True}
    return config


def _adamw(params, cuda: bool) -> torch.optim.Optimizer:
    kwargs = dict(lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, foreach=True, **kwargs)


def plain_master_weights(model, device, dtype, micro_batches: int = 1, fp16: bool = False):
    """DeepSpeed's recipe in plain PyTorch: ``dtype`` weights for forward and backward, fp32 master
    weights, clip by the global norm in fp32, AdamW on the masters, masters copied back; fp16 scales
    the loss (2**FP16_SCALE_POWER, halved and the step skipped on inf/NaN, as with hysteresis 1)."""
    low = model.to(device=device, dtype=dtype)
    params = list(low.parameters())
    masters = [p.detach().float().clone() for p in params]
    optimizer = _adamw(masters, device.type == "cuda")
    scale = [2.0 ** FP16_SCALE_POWER if fp16 else 1.0]

    def step(idx, targets):
        total = torch.zeros((), device=device)
        for part_idx, part_targets in zip(idx.chunk(micro_batches), targets.chunk(micro_batches)):
            loss = low(part_idx, part_targets) / micro_batches
            (loss * scale[0]).backward()
            total += loss.detach().float()
        grads = [p.grad.float() for p in params]
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) / scale[0]
        if torch.isfinite(norm):
            combined = scale[0] * torch.clamp((norm + 1e-6) / CLIP, min=1.0)
            torch._foreach_div_(grads, combined)
            for master, grad in zip(masters, grads):
                master.grad = grad
            optimizer.step()
            with torch.no_grad():
                torch._foreach_copy_(params, masters)
        else:
            scale[0] /= 2
        optimizer.zero_grad(set_to_none=True)
        low.zero_grad(set_to_none=True)
        return total

    return step


def plain_fp32_weights(model, device, autocast: bool):
    """fp32 weights, AdamW, clip by the global norm; under bf16 autocast if asked (the Trainer's --bf16)."""
    model = model.to(device)
    params = list(model.parameters())
    optimizer = _adamw(params, device.type == "cuda")

    def step(idx, targets):
        with torch.autocast(device.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
            loss = model(idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def build_step(engine: str, variant: str, model, device, batch: int):
    """The step function (idx, targets) -> loss of one cell, and the engine object (or None)."""
    if engine == "plain":
        if variant in ("plain", "plain_split", "plain_fp16"):
            dtype = torch.float16 if variant == "plain_fp16" else torch.bfloat16
            return plain_master_weights(model, device, dtype, 2 if variant == "plain_split" else 1,
                                        fp16=variant == "plain_fp16"), None
        return plain_fp32_weights(model, device, autocast=variant == "plain_autocast"), None
    config = engine_config(variant, batch, device.type == "cuda")
    model = model.to(device)
    if engine == "ours":
        from launcher import zero

        engine_object, _, _, _ = zero.initialize(model=model, config=config)
    else:
        import deepspeed

        engine_object, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                      config=config)

    def step(idx, targets):
        loss = engine_object(idx, targets)
        engine_object.backward(loss)
        engine_object.step()
        return loss

    return step, engine_object


class Tee(io.TextIOBase):
    """stdout that keeps a copy of its lines (our engine's progress lines carry its ``mfu=``)."""

    def __init__(self, out):
        self.out, self.lines = out, []

    def write(self, text: str) -> int:
        self.lines.extend(text.splitlines())
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def run_cell(engine: str, name: str, variant: str, template, data, shape, device, broken: str | None) -> dict:
    """Train one cell; its record (losses, timed step ms, peak memory, the engine's own MFU)."""
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = models.CausalLMLoss(copy.deepcopy(template))
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    held_before = torch.cuda.memory_allocated(device) / 2**30 if cuda else None   # > 0: an earlier cell leaked
    tee = Tee(sys.stdout)
    losses, step_ms = [], []
    with contextlib.redirect_stdout(tee):
        step, engine_object = build_step(engine, variant, model, device, shape.batch)
        for i, (idx, targets) in enumerate(data):
            if broken == "raise":
                raise RuntimeError(f"deliberately broken cell {name}:{variant} (--break)")
            if broken == "exit":
                os._exit(9)
            if broken == "hang":
                time.sleep(10**6)
            sync()
            started = time.perf_counter()
            loss = step(idx, targets)
            losses.append(float(loss.detach()))   # reads the loss: a sync
            sync()
            if i >= shape.warmup:
                step_ms.append((time.perf_counter() - started) * 1e3)
    record = {"status": "ok", "losses": losses, "step_ms": [round(t, 3) for t in step_ms],
              "step_ms_median": round(statistics.median(step_ms), 3),
              "peak_mem_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 3) if cuda else None,
              "engine_mfu": engine_mfu(tee.lines, shape.warmup) if engine == "ours" else None,
              "device": torch.cuda.get_device_name(device) if cuda else "cpu",
              "skipped_steps": getattr(engine_object, "skipped_steps", None),
              "held_before_gib": None if held_before is None else round(held_before, 3)}
    destroy = getattr(engine_object, "destroy", None)
    if callable(destroy):
        destroy()
    return record


def last_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]


def prebuild() -> int:
    """Compile DeepSpeed's CPU Adam and fused Adam now, so the first cell that needs one only loads it."""
    from deepspeed.ops.op_builder import CPUAdamBuilder, FusedAdamBuilder

    for builder in (CPUAdamBuilder, FusedAdamBuilder):
        started = time.perf_counter()
        try:
            builder().load()
            print(f"[accept] {builder.__name__}: ready in {time.perf_counter() - started:.0f}s", flush=True)
        except Exception as exc:  # the cells that need it will say so themselves
            print(f"[accept] {builder.__name__}: {last_line(exc)}", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=("plain", "ours", "deepspeed"))
    p.add_argument("--cells", default="", help="model:variant,... in order")
    p.add_argument("--results", help="JSON lines are appended here")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--break", dest="broken", default="", help="model:variant[=raise|exit|hang],...: cells that fail")
    p.add_argument("--prebuild", action="store_true", help="compile DeepSpeed's Adam ops and exit")
    args = p.parse_args(argv)
    if args.prebuild:
        return prebuild()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    shape = models.TINY if args.tiny else models.FULL
    broken = dict((b.split("=") + ["raise"])[:2] for b in args.broken.split(",") if b)
    if args.engine == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    cells = [tuple(c.split(":")) for c in args.cells.split(",") if c]
    template, data, built = None, None, None
    with open(args.results, "a") as results:
        def emit(record: dict) -> None:
            results.write(json.dumps({"engine": args.engine, "time": time.time(), **record}) + "\n")
            results.flush()

        for name, variant in cells:
            emit({"event": "begin", "model": name, "variant": variant})
            started = time.perf_counter()
            common = {"event": "cell", "model": name, "variant": variant}
            try:
                if built != name:   # one template per model: cells are grouped by model
                    template = data = built = None
                    gc.collect()
                    template = models.build_lm(name, args.tiny, device.type)
                    built = name
                    data = [(i.to(device), t.to(device)) for i, t in models.batches(template.config.vocab_size, shape)]
                common.update(params=sum(p.numel() for p in template.parameters()),
                              flops_per_step=models.flops_per_token(template, shape.seq) * shape.batch * shape.seq)
                record = run_cell(args.engine, name, variant, template, data, shape, device,
                                  broken.get(f"{name}:{variant}"))
            except Exception as exc:
                traceback.print_exc()
                record = {"status": "error", "error": last_line(exc)}
            emit({**common, **record, "wall_s": round(time.perf_counter() - started, 2)})
            gc.collect()
            if device.type == "cuda":
                try:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                except Exception:   # a CUDA error poisons the process: the parent starts a new one
                    return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

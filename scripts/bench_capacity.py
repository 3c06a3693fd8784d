#!/usr/bin/env python3
"""Issue 19 item 4: the largest GPT that trains on this GPU, per variant, found by measurement.

For each variant (plain PyTorch; our stage 3; our stage 3 with optimizer and parameter offload)
the GPT's width is fixed and its layer count grows. Two small probes measure what one more
layer costs in GPU memory (peak allocated) and in host memory (peak RSS); a straight line
through them predicts the largest layer count that fits in the GPU and in the host, and the
smaller of the two says what bounds the variant. Then the predicted size is trained for a few
steps (it must fit) and, when the host allows it, the next size up (it should not). Every
attempt runs in its own process; an out-of-memory error there is a result, not a crash.

    python scripts/bench_capacity.py                          # H200: width 4096, batch 2
    python scripts/bench_capacity.py --tiny --variants plain  # CPU smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VARIANTS = ("plain", "zero3", "zero3_offload_all")
# stage 3 with optimizer offload only; and both offloads with bf16 masters, gradients and Adam moments
# (bf16.bf16_master_weights_and_grads and bf16_optimizer_states, issue 43 item 3)
KNOWN = VARIANTS + ("zero3_offload_optimizer", "zero3_offload_optimizer_bf16", "zero3_offload_all_bf16")
BF16_STATES = {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
GIB = 2**30


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--probes", default="2,6", help="two small layer counts that measure the cost of a layer")
    p.add_argument("--steps", type=int, default=3, help="training steps per attempt (the first is untimed)")
    p.add_argument("--headroom", type=float, default=0.94,
                   help="fraction of GPU / available host memory a prediction may use")
    p.add_argument("--host-limit", type=float, default=0.90,
                   help="never start an attempt predicted to need more than this fraction of the host's available memory")
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--tries", type=int, default=4, help="attempts past the probes, per variant")
    p.add_argument("--max-layers", type=int, default=160, help="never try more layers than this")
    p.add_argument("--tiny", action="store_true", help="width 64, seq 32, vocab 256, batch 1 (CPU smoke)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tiny:
        args.width, args.heads, args.seq, args.vocab, args.batch, args.steps = 64, 4, 32, 256, 1, 2
        args.max_layers, args.tries = min(args.max_layers, 4), min(args.tries, 2)
    return args


# ---------------------------------------------------------------- pure helpers

def engine_config(variant: str, batch: int) -> dict | None:
    """The DeepSpeed-style config of a variant (None: plain PyTorch)."""
    if variant == "plain":
        return None
    if variant not in KNOWN:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(KNOWN)}")
    zero: dict = {"stage": 3}
    if variant.startswith(("zero3_offload_all", "zero3_offload_optimizer")):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if variant.startswith("zero3_offload_all"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    bf16 = {"enabled": True, **(BF16_STATES if variant.endswith("_bf16") else {})}
    return {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
            "gradient_clipping": 1.0, "bf16": bf16, "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
            "steps_per_print": 10**9}


def fit_line(probes: list[dict], key: str) -> tuple[float, float]:
    """(bytes at zero layers, bytes per layer) through two probes' readings of ``key``."""
    (a, b) = sorted(probes, key=lambda r: r["layers"])[:2]
    per_layer = (b[key] - a[key]) / (b["layers"] - a["layers"])
    return a[key] - per_layer * a["layers"], per_layer


def largest_fit(base: float, per_layer: float, budget: float) -> int:
    """The largest layer count whose predicted bytes stay within budget (0 when none)."""
    if per_layer <= 0:   # this memory does not grow with the layers (the probes' difference is noise)
        return 10**6
    return max(0, int((budget - base) // per_layer))


def predict(probes: list[dict], gpu_bytes: float, host_bytes: float, headroom: float,
            max_layers: int) -> dict:
    """Largest layer count by the GPU line and by the host line, and which one binds."""
    gpu = largest_fit(*fit_line(probes, "peak_gpu_bytes"), gpu_bytes * headroom) if gpu_bytes else max_layers
    host = largest_fit(*fit_line(probes, "peak_host_bytes"), host_bytes * headroom)
    bound = "GPU memory" if gpu <= host else "host memory"
    if min(gpu, host) >= max_layers:
        bound = f"--max-layers {max_layers}"
    gpu, host = min(gpu, max_layers), min(host, max_layers)
    return {"layers_by_gpu": gpu, "layers_by_host": host, "layers": min(gpu, host), "bound": bound}


def marginal_per_param(probes: list[dict], key: str) -> float | None:
    """Bytes of ``key`` one more parameter costs, from the two probes (what a larger model adds:
    fixed costs such as the CUDA context, pinned staging slots or the embeddings cancel out)."""
    (a, b) = sorted(probes, key=lambda r: r["layers"])[:2]
    if a.get(key) is None or b.get(key) is None or b["params"] == a["params"]:
        return None
    return round((b[key] - a[key]) / (b["params"] - a["params"]), 2)


def host_need(probes: list[dict], layers: int) -> float:
    base, per_layer = fit_line(probes, "peak_host_bytes")
    return base + per_layer * layers


def next_layers(tried: list[dict]) -> int:
    """Bisect between the largest size that trained and the smallest that did not (+-10% outside)."""
    ok = [t["layers"] for t in tried if t["status"] == "ok"]
    bad = [t["layers"] for t in tried if t["status"] != "ok"]
    if ok and not [b for b in bad if b > max(ok)]:
        return max(ok) + max(1, max(ok) // 10)
    if not ok:
        return min(bad) - max(1, min(bad) // 10)
    high = min(b for b in bad if b > max(ok))
    return (max(ok) + high) // 2


def count_params(width: int, layers: int, seq: int, vocab: int) -> int:
    per_block = 12 * width * width + 13 * width
    return 2 * vocab * width + seq * width + layers * per_block + 2 * width


# ---------------------------------------------------------------- parent

def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def attempt(args, variant: str, layers: int) -> dict:
    cmd = [sys.executable, "-u", os.path.abspath(__file__), "--worker", variant, "--layers", str(layers),
           "--width", str(args.width), "--heads", str(args.heads), "--seq", str(args.seq),
           "--vocab", str(args.vocab), "--batch", str(args.batch), "--steps", str(args.steps)]
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29650 + layers % 300), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        out, err, rc = "", "", None
    record = None
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            record = json.loads(line)
            break
    if record is None:   # killed from outside (the host's OOM killer, a timeout)
        why = "timed out" if rc is None else f"exit code {rc}"
        record = {"status": "error", "reason": f"{why}: {' | '.join(err.strip().splitlines()[-2:])}"[:300]}
    record.update(variant=variant, layers=layers, wall_s=round(time.monotonic() - started, 1),
                  params=count_params(args.width, layers, args.seq, args.vocab))
    record["params_b"] = round(record["params"] / 1e9, 3)
    for place in ("host", "gpu"):   # what one parameter costs where, at this size (issue 32 item 4)
        if record.get(f"peak_{place}_bytes"):
            record[f"{place}_bytes_per_param"] = round(record[f"peak_{place}_bytes"] / record["params"], 2)
    if record.get("offload_state_bytes"):
        record["offload_state_bytes_per_param"] = round(record["offload_state_bytes"] / record["params"], 2)
    print(f"[capacity] {variant} {layers} layers ({record['params_b']}B): {record['status']} "
          f"{record.get('reason', '')}", file=sys.stderr, flush=True)
    print(json.dumps(record), flush=True)
    return record


def search(args, variant: str, gpu_bytes: int) -> dict:
    probes = [attempt(args, variant, int(n)) for n in args.probes.split(",")]
    if any(p["status"] != "ok" for p in probes):
        return {"variant": variant, "status": "probe failed"}
    available = mem_available()
    guess = predict(probes, gpu_bytes, available, args.headroom, args.max_layers)
    tried: list[dict] = []
    layers = guess["layers"]
    while 0 < layers <= args.max_layers and len(tried) < args.tries and not any(t["layers"] == layers for t in tried):
        if host_need(probes, layers) > args.host_limit * available:
            tried.append({"layers": layers, "status": "not started",
                          "reason": f"predicted host memory {host_need(probes, layers) / GIB:.1f} GiB "
                                    f"> {args.host_limit:.0%} of {available / GIB:.1f} GiB available"})
        else:
            tried.append(attempt(args, variant, layers))
        layers = next_layers(tried)
    fits = [t for t in tried if t["status"] == "ok"]
    best = max(fits, key=lambda t: t["layers"]) if fits else None
    too_big = [t for t in tried if t["status"] != "ok" and (best is None or t["layers"] > best["layers"])]
    marginal = {f"{key}_per_param_marginal": marginal_per_param(probes, key)
                for key in ("peak_host_bytes", "offload_state_bytes")}
    return {"variant": variant, "summary": True, "prediction": guess, "host_available_gib": round(available / GIB, 1),
            "gpu_gib": round(gpu_bytes / GIB, 1), **marginal,
            "largest_ok": best and {k: best.get(k) for k in ("layers", "params", "params_b", "tokens_per_s",
                                                          "peak_gpu_gib", "peak_host_gib", "host_bytes_per_param",
                                                          "gpu_bytes_per_param")},
            "next_size": too_big and {k: too_big[0].get(k) for k in ("layers", "status", "reason")}}


def main_parent(args) -> int:
    unknown = [v for v in args.variants.split(",") if v.strip() and v.strip() not in KNOWN]
    if unknown:
        print(f"unknown variant(s) {unknown}; known: {', '.join(KNOWN)}", file=sys.stderr)
        return 2
    gpu_bytes = 0
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_properties(0).total_memory "
                            "if torch.cuda.is_available() else 0)"], capture_output=True, text=True)
    gpu_bytes = int(probe.stdout.strip() or 0)
    rows = [search(args, v.strip(), gpu_bytes) for v in args.variants.split(",") if v.strip()]
    for row in rows:
        print(json.dumps(row), flush=True)
    plain = next((r for r in rows if r["variant"] == "plain" and r.get("largest_ok")), None)
    for row in rows:
        best = row.get("largest_ok")
        if not best:
            print(f"{row['variant']:<24} no size trained ({row.get('status', '')})", file=sys.stderr)
            continue
        ratio = f"{best['params'] / plain['largest_ok']['params']:.2f}x plain" if plain else ""
        states = row.get("offload_state_bytes_per_param_marginal")
        print(f"{row['variant']:<24} {best['layers']:>4} layers {best['params_b']:>7.2f}B params "
              f"{best['tokens_per_s']:>9.0f} tok/s  bound: {row['prediction']['bound']}  {ratio}  "
              f"B/param host {best.get('host_bytes_per_param')} gpu {best.get('gpu_bytes_per_param')}"
              + (f" offloaded states {states}" if states is not None else ""), file=sys.stderr)
    return 0


# ---------------------------------------------------------------- worker: one attempt

def offload_state_bytes(engine, cfg: dict):
    """A callable giving the bytes of the states optimizer offload keeps in host memory: the masters,
    Adam's moments and the gradients' host buffers (None without optimizer offload). Counted from the
    tensors, so a CPU run gives the figure a GPU run's host holds for them."""
    if "offload_optimizer" not in cfg["zero_optimization"]:
        return lambda: None

    def count() -> int:
        memory = engine.memory_breakdown()
        masters = sum(p.numel() * p.element_size() for group in engine.basic_optimizer.param_groups
                      for p in group["params"])
        return masters + memory["optimizer_states"] + memory.get("host_gradients", 0)

    return count


def main_worker(args) -> int:
    import torch

    sys.path[:0] = [REPO]
    from tests.helpers.gpt import GPT, GPTConfig

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    config = GPTConfig(n_layer=args.layers, n_embd=args.width, n_head=args.heads,
                       seq_len=args.seq, vocab_size=args.vocab)
    cfg = engine_config(args.worker, args.batch)

    def emit(record: dict) -> int:
        peak_host = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        record.update(peak_host_bytes=peak_host, peak_host_gib=round(peak_host / GIB, 2))
        if cuda:
            peak = torch.cuda.max_memory_allocated(device)
            record.update(peak_gpu_bytes=peak, peak_gpu_gib=round(peak / GIB, 2))
        print(json.dumps(record), flush=True)
        return 0

    state_bytes = offload_state_bytes(None, {"zero_optimization": {}})   # plain: nothing offloaded
    try:
        torch.manual_seed(0)
        if cfg is None:
            with torch.device(device):
                model = GPT(config)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                                          **({"fused": True} if cuda else {}))

            def step(idx, targets):
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                    loss = model(idx, targets)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                return loss
        else:
            from launcher import zero

            with zero.Init(config_dict_or_path=cfg), torch.device(device):
                model = GPT(config)
            engine, _, _, _ = zero.initialize(model=model, config=cfg)
            state_bytes = offload_state_bytes(engine, cfg)

            def step(idx, targets):
                loss = engine(idx, targets)
                engine.backward(loss)
                engine.step()
                return loss

        gen = torch.Generator(device=device).manual_seed(1)
        tokens = torch.randint(0, config.vocab_size, (args.batch, config.seq_len + 1), device=device, generator=gen)
        idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        times = []
        for i in range(args.steps):
            if cuda:
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            loss = float(step(idx, targets))
            if cuda:
                torch.cuda.synchronize(device)
            if i:
                times.append(time.perf_counter() - started)
    except torch.OutOfMemoryError as exc:
        return emit({"status": "oom", "reason": f"GPU: {str(exc).splitlines()[0][:160]}"})
    except MemoryError:
        return emit({"status": "oom", "reason": "host: MemoryError"})
    except RuntimeError as exc:
        if "out of memory" in str(exc).lower() or "alloc" in str(exc).lower():
            return emit({"status": "oom", "reason": str(exc).splitlines()[0][:200]})
        raise
    step_s = sorted(times)[len(times) // 2] if times else float("nan")
    return emit({"status": "ok", "step_s": round(step_s, 3), "loss": round(loss, 4),
                 "tokens_per_s": round(args.batch * args.seq / step_s, 1) if times else None,
                 "offload_state_bytes": state_bytes()})


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return main_worker(args)
    return main_parent(args)


if __name__ == "__main__":
    sys.exit(main())

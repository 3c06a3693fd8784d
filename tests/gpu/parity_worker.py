"""One process (world size 1) that trains the small benchmark GPT with our engine at each stage
and precision, next to a plain-PyTorch mixed-precision reference, and prints one JSON line per case.

The reference is what the engine promises: low-precision weights for forward and backward, fp32
master weights, loss x scale, unscale and clip by the global norm in fp32, torch AdamW on the
masters, masters copied back. Run by tests/gpu/test_engine_parity.py (NCCL on the GPU); it also
runs on the CPU with gloo, which is how it was checked without a GPU:

    python tests/gpu/parity_worker.py --cases zero2-bf16,zero3-fp16
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)   # run as a script: python tests/gpu/parity_worker.py

from tests.helpers.gpt import GPT, GPTConfig  # noqa: E402

MODEL = GPTConfig(n_layer=2, n_embd=128, n_head=4, seq_len=128, vocab_size=512)
BATCH, STEPS, LR, WEIGHT_DECAY, BETAS, EPS, CLIP = 4, 6, 1e-3, 0.1, (0.9, 0.95), 1e-8, 1.0
FP16_SCALE_POWER = 12
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ALL_CASES = [f"zero{s}-{p}" for s in range(4) for p in ("bf16", "fp16")] + [
    "zero2_offload-bf16", "zero3_offload-bf16", "zero2_offload_overlap-bf16", "zero3_offload_overlap-bf16"]
# negative controls: the engine trains with a learning rate 5% off; the bounds must catch it
CONTROL_CASES = ["zero2-bf16-lrx1.05", "zero2_offload-bf16-lrx1.05"]


def engine_config(stage: int, precision: str, offload: bool, lr: float = LR, overlap: bool = False) -> dict:
    zero: dict = {"stage": stage, "reduce_bucket_size": 20000}  # several buckets even when tiny
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available(),
                                     "overlap_step": overlap}
    config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
              "gradient_clipping": CLIP, "zero_optimization": zero, "steps_per_print": 10**9,
              "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": list(BETAS), "eps": EPS,
                                                        "weight_decay": WEIGHT_DECAY}}}
    if precision == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": FP16_SCALE_POWER}
    else:
        config["bf16"] = {"enabled": True}
    return config


def batches(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator(device="cpu").manual_seed(7)
    out = []
    for _ in range(3):
        tokens = torch.randint(0, MODEL.vocab_size, (BATCH, MODEL.seq_len + 1), generator=gen)
        out.append((tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)))
    return out


def reference(model: torch.nn.Module, dtype: torch.dtype, data, scale: float,
              master_device: torch.device | None = None):
    """Plain mixed-precision training; returns (losses, low-precision state, fp32 masters, skipped).

    ``master_device`` cpu: the masters and AdamW live on the CPU, as with optimizer offload
    (CPU and GPU AdamW round differently, and 6 steps of bf16 training amplify that to ~1%).
    """
    low = copy.deepcopy(model).to(dtype)
    names = [n for n, _ in low.named_parameters()]
    masters = [p.detach().float().to(master_device).clone().requires_grad_(True)
               for p in low.parameters()]
    optimizer = same_optimizer(masters, offload=master_device is not None and master_device.type == "cpu")
    losses, skipped = [], 0
    for step in range(STEPS):
        idx, targets = data[step % len(data)]
        loss = low(idx, targets)
        losses.append(float(loss.detach()))
        (loss * scale).backward()
        grads = [p.grad.detach().float() for p in low.parameters()]
        squares = sum(g.double().pow(2).sum() for g in grads)
        if not torch.isfinite(squares):
            skipped += 1
        else:
            norm = float(squares.sqrt()) / scale
            combined = scale * max(1.0, (norm + 1e-6) / CLIP)
            for master, grad in zip(masters, grads):
                master.grad = (grad * (1.0 / combined)).to(master.device)
            optimizer.step()
            with torch.no_grad():
                for param, master in zip(low.parameters(), masters):
                    param.copy_(master)
        optimizer.zero_grad(set_to_none=True)
        low.zero_grad(set_to_none=True)
    state = {k: v.detach().clone() for k, v in low.state_dict().items()}
    return losses, state, dict(zip(names, (m.detach() for m in masters))), skipped


def same_optimizer(masters, offload: bool):
    """The optimizer the engine builds from this config (fused AdamW on the GPU, CPU Adam with
    offload), so that engine and reference differ in nothing but the engine's own work."""
    from launcher.zero.config.load import load_config
    from launcher.zero.optim.factory import build_optimizer

    spec = load_config(engine_config(2, "bf16", offload), world_size=1).optimizer
    return build_optimizer(spec, masters, offload=offload)


def rel_err(got: dict, want: dict, base: dict | None = None) -> float:
    """||got - want|| / ||want - base|| over all tensors (base None: / ||want||)."""
    diff = sum(float((got[k].float().cpu() - want[k].float().cpu()).pow(2).sum()) for k in want)
    ref = sum(float((want[k].float().cpu() - (0 if base is None else base[k].float().cpu())).pow(2).sum())
              for k in want)
    return math.sqrt(diff) / max(math.sqrt(ref), 1e-30)


def run_case(case: str, device: torch.device) -> dict:
    from launcher import zero

    variant, precision, *control = case.split("-")
    lr = LR * (float(control[0][3:]) if control else 1.0)
    stage, offload, overlap = int(variant[4]), "_offload" in variant, variant.endswith("_overlap")
    dtype = DTYPES[precision]
    torch.manual_seed(0)
    model = GPT(MODEL).to(device)
    initial = {k: v.detach().to(dtype).float().clone() for k, v in model.named_parameters()}
    data = batches(device)
    scale = 2.0 ** FP16_SCALE_POWER if precision == "fp16" else 1.0
    ref_losses, ref_state, ref_masters, ref_skipped = reference(
        model, dtype, data, scale, torch.device("cpu") if offload else device)

    engine, _, _, _ = zero.initialize(model=model, config=engine_config(stage, precision, offload, lr, overlap),
                                      process_group=dist.group.WORLD)
    losses = []
    for step in range(STEPS):
        idx, targets = data[step % len(data)]
        loss = engine(idx, targets)
        losses.append(float(loss.detach()))
        engine.backward(loss)
        engine.step()
    state = {k: v.detach().clone() for k, v in engine.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        engine.save_checkpoint(tmp, tag="parity")
        masters = zero.get_fp32_state_dict_from_zero_checkpoint(tmp, tag="parity")
    result = {
        "case": case, "device": str(device), "steps": STEPS,
        "skipped_steps": engine.skipped_steps, "ref_skipped_steps": ref_skipped,
        "loss_max_abs_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
        "loss_first": losses[0], "loss_last": losses[-1], "ref_loss_last": ref_losses[-1],
        "weights_rel_err": rel_err(state, ref_state),
        "masters_rel_err": rel_err(masters, ref_masters),
        "masters_err_vs_update": rel_err(masters, ref_masters, initial),
    }
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(ALL_CASES + CONTROL_CASES))
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    # Engine and reference run the same kernels; deterministic ones keep the comparison tight.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    if cuda:
        torch.cuda.set_device(device)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1)
    try:
        for case in args.cases.split(","):
            try:
                record = run_case(case, device)
            except Exception as exc:  # one broken case must not hide the others
                record = {"case": case, "error": f"{type(exc).__name__}: {exc}"[:800]}
            print(json.dumps(record), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

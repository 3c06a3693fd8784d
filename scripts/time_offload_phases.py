#!/usr/bin/env python3
"""Median time of forward, backward and step() of ZeRO-Offload, with and without overlap_step.

One process, world size 1, on the GPU when there is one, else on the CPU (where the "device" and
the host share the same cores, so the overlap cannot gain there; it shows the mechanism and the
same loss, not a speed-up).

    python scripts/time_offload_phases.py --stage 2 --overlap
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", type=int, default=2, choices=(1, 2, 3))
    p.add_argument("--overlap", action="store_true", help="offload_optimizer.overlap_step: true")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--port", type=int, default=29561)
    args = p.parse_args(argv)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    sys.path.insert(0, REPO)
    import torch
    from launcher import zero
    from tests.helpers.gpt import GPT, GPTConfig

    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=args.layers, n_embd=args.width, n_head=4, seq_len=128, vocab_size=4096))
    offload = {"device": "cpu", "pin_memory": True, "overlap_step": args.overlap}
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0, "bf16": {"enabled": True},
              "steps_per_print": 10**9, "zero_optimization": {"stage": args.stage, "offload_optimizer": offload},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    tokens = torch.randint(0, 4096, (4, 129), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {"forward": [], "backward": [], "step": [], "total": []}
    for i in range(3 + args.steps):
        sync()
        t0 = time.perf_counter()
        loss = engine(tokens[:, :-1], tokens[:, 1:])
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        engine.step()
        sync()
        t3 = time.perf_counter()
        if i >= 3:   # the first steps build the optimizer state
            for key, value in zip(times, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                times[key].append(value * 1e3)
    engine.wait_for_step()
    print(f"stage={args.stage} overlap={args.overlap} device={device.type} "
          + " ".join(f"{k}={statistics.median(v):.1f}ms" for k, v in times.items())
          + f" loss={float(loss.detach()):.5f}", flush=True)
    engine.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())

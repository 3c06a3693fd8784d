"""bf16 training at a ZeRO stage, per-step losses (issue 30: DeepSpeed's stage-0 bf16 path rounds its own way).

Written as a DeepSpeed script (``import deepspeed``): it runs unchanged under a real DeepSpeed and under
``dslaunch --as-deepspeed``. ``bf16_steps_worker.py STAGE [--out DIR]``: a small MLP in bf16, 12 optimizer
steps of 2 micro-batches of 4 samples per rank (AdamW, gradient clipping 1.0); each rank reads its own
slice of one fixed data set, so nothing depends on a loader. Rank 0 prints ``RESULT {"losses": [...],
"weights": [...]}``: per step the loss averaged over the ranks and micro-batches, and the final fp32
weights (``safe_get_full_fp32_param`` is not needed: stage 0 keeps them whole, others are gathered).
"""
import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

STEPS, MICRO, GAS = 12, 4, 2


def data(world: int):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * GAS * MICRO * world, 8, generator=generator)
    y = torch.tanh(x @ torch.randn(8, 4, generator=generator)) + 0.05 * torch.randn(len(x), 4, generator=generator)
    return x, y


def main(stage: int, out=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
              "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.01}}, "steps_per_print": 1000}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = data(world)
    losses = []
    for step in range(STEPS):
        total = torch.zeros(())
        for micro in range(GAS):
            at = ((step * GAS + micro) * world + rank) * MICRO
            out_ = engine(x[at:at + MICRO].to(torch.bfloat16))
            loss = torch.nn.functional.mse_loss(out_.float(), y[at:at + MICRO])
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        dist.all_reduce(total)
        losses.append(total.item() / (GAS * world))
    if rank == 0:
        weights = [round(float(p.detach().float().abs().sum()), 6) for p in model.parameters()] if stage < 3 else []
        record = {"losses": losses, "weights": weights}
        print("RESULT " + json.dumps(record), flush=True)
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "rank0.json").write_text(json.dumps(record))


if __name__ == "__main__":
    argv = sys.argv[1:]
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    main(int(argv[0]), out)

"""Training through the optimizer ``deepspeed.initialize`` returns, the ways frameworks drive it (issue 41).

Written as a DeepSpeed script (``import deepspeed``): it runs unchanged under a real DeepSpeed and under
``dslaunch --as-deepspeed``. ``returned_optimizer_worker.py STAGE LOOP [--out DIR]``; LOOP is one of

    engine     engine.backward(loss); engine.step()                       (a plain DeepSpeed script, Accelerate)
    optimizer  engine.backward(loss); optimizer.step(); optimizer.zero_grad()   (Lightning Fabric's DeepSpeed
               strategy: its precision plugin calls the returned optimizer's step(), never engine.step())
    both       engine.backward(loss); optimizer.step(); engine.step()     (a script that steps twice)
    lightning  out = engine(x); optimizer.zero_grad(); engine.backward(loss); engine.step()
               (the Lightning Trainer: zero_grad on the returned optimizer between forward and backward)

A small MLP in fp32, 8 steps of 4 samples per rank, AdamW with gradient clipping 0.5 and a WarmupLR
schedule from the config; each rank reads its own slice of one fixed data set. Rank 0 prints
``RESULT {...}``: per step the loss averaged over the ranks, the learning rate after the step, the
engine's global_steps at the end and the final weights' absolute sums.
"""
import json
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

STEPS, MICRO = 8, 4
LOOPS = ("engine", "optimizer", "both", "lightning")


def data(world: int):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(STEPS * MICRO * world, 8, generator=generator)
    y = torch.tanh(x @ torch.randn(8, 4, generator=generator)) + 0.05 * torch.randn(len(x), 4, generator=generator)
    return x, y


def main(stage: int, loop: str, out=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "gradient_clipping": 0.5,
              "zero_optimization": {"stage": stage}, "steps_per_print": 1000,
              "optimizer": {"type": "AdamW", "params": {"lr": 5e-2, "weight_decay": 0.01}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 1e-2, "warmup_max_lr": 5e-2,
                                                           "warmup_num_steps": 4, "warmup_type": "linear"}}}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = data(world)
    losses, lrs = [], []
    for step in range(STEPS):
        at = (step * world + rank) * MICRO
        output = engine(x[at:at + MICRO])
        if loop == "lightning":
            optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(output, y[at:at + MICRO])
        engine.backward(loss)
        if loop in ("optimizer", "both"):
            optimizer.step()
        if loop == "optimizer":
            optimizer.zero_grad()
        if loop in ("engine", "both", "lightning"):
            engine.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
        lrs.append(optimizer.param_groups[0]["lr"])
    weights = [float(p.detach().abs().sum()) for p in _full_parameters(engine, stage)]
    if rank == 0:
        record = {"losses": losses, "lrs": lrs, "global_steps": engine.global_steps,
                  "weights": [round(w, 6) for w in weights]}
        print("RESULT " + json.dumps(record), flush=True)
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "rank0.json").write_text(json.dumps(record))


def _full_parameters(engine, stage: int):
    params = list(engine.module.parameters())
    if stage < 3:
        return [p.detach().clone() for p in params]
    with deepspeed.zero.GatheredParameters(params):
        return [p.detach().clone() for p in params]


if __name__ == "__main__":
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[1] not in LOOPS:
        sys.exit(f"usage: returned_optimizer_worker.py STAGE {{{','.join(LOOPS)}}} [--out DIR]")
    main(int(argv[0]), argv[1], argv[argv.index("--out") + 1] if "--out" in argv else None)

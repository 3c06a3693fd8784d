"""DeepSpeed 0.19's Muon optimizer at a ZeRO stage, per-step losses (issue 41).

Written as a DeepSpeed script (``import deepspeed``): it runs unchanged under a real DeepSpeed and under
``dslaunch --as-deepspeed``. ``muon_steps_worker.py STAGE [--out DIR] [--persistence N]``: a small fp32 model whose
parameters fall on both sides of Muon's split (matrices get Muon; biases and the layer named ``embed``
get the auxiliary Adam), 8 optimizer steps of 2 micro-batches of 4 samples per rank, with separate
``muon_lr`` / ``adam_lr``. Rank 0 prints ``RESULT {"losses": [...], "weights": [...]}``: per step the
loss averaged over the ranks and micro-batches, and each parameter's final absolute sum.
"""
import json
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

STEPS, MICRO, GAS = 8, 4, 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(8, 16)     # a matrix, but named embed: Adam's
        self.hidden = torch.nn.Linear(16, 24)   # Muon's weight, Adam's bias
        self.out = torch.nn.Linear(24, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(torch.tanh(self.embed(x)))))


def data(world: int):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * GAS * MICRO * world, 8, generator=generator)
    y = torch.tanh(x @ torch.randn(8, 4, generator=generator)) + 0.05 * torch.randn(len(x), 4, generator=generator)
    return x, y


def main(stage: int, out=None, persistence=None):
    torch.manual_seed(0)
    model = Net()
    zero = {"stage": stage, **({"reduce_scatter": False} if stage == 3 else {})}
    if persistence is not None:   # stage 3: partition even these small matrices (the default keeps them whole)
        zero["stage3_param_persistence_threshold"] = persistence
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
              "zero_optimization": zero, "steps_per_print": 1000,
              "optimizer": {"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 5e-3, "momentum": 0.9,
                                                        "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = data(world)
    losses = []
    for step in range(STEPS):
        total = torch.zeros(())
        for micro in range(GAS):
            at = ((step * GAS + micro) * world + rank) * MICRO
            loss = torch.nn.functional.mse_loss(engine(x[at:at + MICRO]), y[at:at + MICRO])
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        dist.all_reduce(total)
        losses.append(total.item() / (GAS * world))
    if rank == 0:
        weights = [round(float(p.detach().abs().sum()), 6) for p in model.parameters()] if stage < 3 else []
        record = {"losses": losses, "weights": weights}
        print("RESULT " + json.dumps(record), flush=True)
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "rank0.json").write_text(json.dumps(record))


if __name__ == "__main__":
    argv = sys.argv[1:]
    out = argv[argv.index("--out") + 1] if "--out" in argv else None
    persistence = int(argv[argv.index("--persistence") + 1]) if "--persistence" in argv else None
    main(int(argv[0]), out, persistence)

"""Partial optimizer offload (``offload_optimizer.ratio``) at ZeRO stage 3, per-step losses (issue 43 item 2).

Written as a DeepSpeed script: ``--engine deepspeed`` (the default) runs it with ``import deepspeed``,
``--engine dslaunch`` with ``from launcher import zero as deepspeed`` (the port rule of
docs/migrating/deepspeed.md; it runs where a real DeepSpeed is installed, which ``--as-deepspeed``
refuses). ``partial_offload_worker.py RATIO [--engine E] [--out DIR]``: stage 3 with the optimizer
offloaded to the CPU at RATIO, ``sub_group_size`` 300 (the 8-64-64-4 MLP's weights cut into 3 of
DeepSpeed's sub-groups on 2 ranks, its biases one more), fp32, 8 optimizer steps of 2 micro-batches of 4
samples per rank (AdamW with weight decay, gradient clipping 0.5, which clips every step here); each rank
reads its own slice of one fixed data set. Rank 0 prints ``RESULT {"losses": [...], "weights": [...]}``:
per step the loss averaged over the ranks and micro-batches, and each parameter's absolute sum at the
end (gathered). On a CPU host DeepSpeed's accelerator is the CPU, so its "device" part steps there too.
"""
import importlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

STEPS, MICRO, GAS = 8, 4, 2


def data(world: int):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS * GAS * MICRO * world, 8, generator=generator)
    y = torch.tanh(x @ torch.randn(8, 4, generator=generator)) + 0.05 * torch.randn(len(x), 4, generator=generator)
    return x, y


def config(ratio: float) -> dict:
    zero = {"stage": 3, "sub_group_size": 300, "stage3_param_persistence_threshold": 100,
            "offload_optimizer": {"device": "cpu", "ratio": ratio}}
    return {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
            "gradient_clipping": 0.5, "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.01}}, "steps_per_print": 1000}


def main(ratio: float, engine_name: str = "deepspeed", out=None):
    deepspeed = importlib.import_module("deepspeed" if engine_name == "deepspeed" else "launcher.zero")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 4))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(ratio))
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
    params = list(model.parameters())
    with deepspeed.zero.GatheredParameters(params):
        final = [round(float(p.detach().abs().sum()), 6) for p in params]
    if rank == 0:
        record = {"losses": losses, "weights": final}
        print("RESULT " + json.dumps(record), flush=True)
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "rank0.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()   # DeepSpeed's CPU run otherwise aborts now and then at exit (gloo's threads)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    folder = arguments[arguments.index("--out") + 1] if "--out" in arguments else None
    name = arguments[arguments.index("--engine") + 1] if "--engine" in arguments else "deepspeed"
    main(float(arguments[0]), name, folder)

"""Muon's checkpoint round trip (issue 41): save after SAVE_AT steps, resume in a fresh engine.

``muon_ckpt_worker.py SESSION...``, each session ``MODE:DIR:STAGE``:

  train    8 steps of muon_steps_worker's model and data, saving (tag "mid") after step SAVE_AT
  resume   a fresh model and engine load "mid" and train steps SAVE_AT..8

The world's size may differ from the one that saved: the global batch of each step is the same
samples (GAS grows as the world shrinks). Rank 0 prints ``RESULT {index: {"losses": [...]}}``,
the per-step loss averaged over the ranks and micro-batches.
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from muon_steps_worker import Net, data  # noqa: E402  the recorded model and samples

from launcher import zero  # noqa: E402

STEPS, SAVE_AT, MICRO, GLOBAL_MICROS = 8, 3, 4, 4   # 4 micro-batches of 4 samples per step, whatever the world


def zero_section(stage: int) -> dict:
    """Stage 3 as DeepSpeed takes Muon (reduce_scatter false), every matrix partitioned (persistence 0)."""
    if stage == 3:
        return {"stage": 3, "reduce_scatter": False, "stage3_param_persistence_threshold": 0}
    return {"stage": stage}


def session(mode: str, folder: str, stage: int, rank: int, world: int) -> dict:
    torch.manual_seed(0)
    model = Net()
    gas = GLOBAL_MICROS // world
    config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
              "zero_optimization": zero_section(stage), "steps_per_print": 1000,
              "optimizer": {"type": "Muon", "params": {"muon_lr": 0.02, "adam_lr": 5e-3, "momentum": 0.9,
                                                        "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01}}}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    x, y = data(2)   # the samples of a 2-rank run: the same global batches at any world size
    first = 0
    if mode == "resume":
        engine.load_checkpoint(folder, tag="mid")
        first = engine.global_steps
    losses = []
    for step in range(first, STEPS):
        if mode == "train" and step == SAVE_AT:
            engine.save_checkpoint(folder, tag="mid")
        total = torch.zeros(())
        for micro in range(gas):
            at = (step * GLOBAL_MICROS + micro * world + rank) * MICRO
            loss = torch.nn.functional.mse_loss(engine(x[at:at + MICRO]), y[at:at + MICRO])
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        if world > 1:
            dist.all_reduce(total)
        losses.append(total.item() / GLOBAL_MICROS)
    return {"losses": losses, "first": first}


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = {}
    for index, item in enumerate(sys.argv[1:]):
        mode, folder, stage = item.split(":")
        results[index] = session(mode, folder, int(stage), rank, world)
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()

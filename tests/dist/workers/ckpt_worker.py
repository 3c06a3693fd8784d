"""Rank-side checkpoint checks; each argument is a session ``MODE:DIR:STAGE:DROPOUT``:

  train    train 6 steps, save after step 3 (tag "mid", client_state) and after step 6
  resume   a fresh model and engine load "mid" and train on to step 6
  moduleonly  load "mid" with load_module_only=True
Prints one ``RESULT {json}`` (rank 0) with each session's final weights, steps and lr.
"""
import json
import sys

import torch

from launcher import zero

STEPS, SAVE_AT, MBS, GAS = 6, 3, 2, 2


def make_model(dropout):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Dropout(dropout), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def config(stage):
    return {"train_batch_size": 24, "train_micro_batch_size_per_gpu": MBS if stage >= 0 else 1,
            "gradient_clipping": 0.5, "zero_optimization": {"stage": stage, "reduce_bucket_size": 10},
            "optimizer": {"type": "Adam", "params": {"lr": 0.02, "weight_decay": 0.01}},
            "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.02, "warmup_num_steps": 4, "warmup_type": "linear"}}}


def run_steps(engine, rank, world_size, first, last):
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(24 * STEPS, 7, generator=gen), torch.randn(24 * STEPS, 3, generator=gen)
    per_rank = 24 // world_size
    gas = engine.gradient_accumulation_steps()
    mbs = engine.train_micro_batch_size_per_gpu()
    for step in range(first, last):
        for micro in range(gas):
            start = step * 24 + rank * per_rank + micro * mbs
            loss = torch.nn.functional.mse_loss(engine(x[start:start + mbs]), y[start:start + mbs])
            engine.backward(loss)
            engine.step()


def weights(model):
    return [p.detach().flatten().tolist() for p in model.parameters()]


def session(folder, stage, dropout, rank, world_size, mode):
    model = make_model(dropout)
    cfg = config(stage)
    cfg["train_micro_batch_size_per_gpu"] = 24 // world_size // GAS
    cfg.pop("train_batch_size")
    cfg["gradient_accumulation_steps"] = GAS
    engine, optimizer, _, scheduler = zero.initialize(model=model, config=cfg)
    if mode == "train":
        run_steps(engine, rank, world_size, 0, SAVE_AT)
        engine.save_checkpoint(folder, tag="mid", client_state={"epoch": 7})
        mid = weights(model)
        run_steps(engine, rank, world_size, SAVE_AT, STEPS)
        engine.save_checkpoint(folder)
    elif mode == "moduleonly":  # weights only: counters, optimizer and scheduler stay fresh
        engine.load_checkpoint(folder, tag="mid", load_module_only=True)
        return {"weights": weights(model), "steps": engine.global_steps, "lr": engine.get_lr(),
                "optimizer_state": len(engine.optimizer.state)}
    else:
        path, client = engine.load_checkpoint(folder, tag="mid")
        assert client == {"epoch": 7}, client
        assert engine.global_steps == SAVE_AT, engine.global_steps
        run_steps(engine, rank, world_size, SAVE_AT, STEPS)
    result = {"weights": weights(model), "steps": engine.global_steps, "lr": engine.get_lr(),
              "memory": engine.memory_breakdown()}
    if mode == "train":
        result["mid_weights"] = mid
    return result


def main():
    import os
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = {}
    # argv: a list of "mode:folder:stage:dropout" sessions, run one after another in this world
    for index, item in enumerate(sys.argv[1:]):
        mode, folder, stage, dropout = item.split(":")
        results[index] = session(folder, int(stage), float(dropout), rank, world_size, mode)
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()

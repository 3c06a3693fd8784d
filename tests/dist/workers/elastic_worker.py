"""Rank side of the resume-at-another-world-size test: ``DIR STOP_AT LAST [KILL_AT]``.

A script written the way users are told to: ``load_checkpoint(DIR)`` at start (nothing there: a
no-op), the engine's own loader (``training_data=``), ``save_checkpoint(DIR)`` every SAVE_EVERY
steps. It leaves its loop after step STOP_AT (a crash stand-in; no save there) or at LAST.
Rank 0 prints ``RESULT {json}``: per step the global batch's sample ids and mean loss, and the
final weights. With KILL_AT, rank 1 of the first try (DSLAUNCH_RESTART_COUNT 0) SIGKILLs itself
in the middle of the save of step KILL_AT, once its shard is on disk and before the save is published.
Environment: ELASTIC_TBS (train_batch_size, default 8), ELASTIC_STEP_SLEEP (seconds after each step,
so that a test can cut a node in the middle); rank 0 prints ``STEP n TRY t WORLD w`` after each step.
"""
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from launcher import zero

SAMPLES, SAVE_EVERY = 96, 2
CONFIG = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 1,
          "zero_optimization": {"stage": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.01}}}


def dataset():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(SAMPLES, 6, generator=gen)
    y = x @ torch.randn(6, 2, generator=gen) + 0.1 * torch.randn(SAMPLES, 2, generator=gen)
    return torch.utils.data.TensorDataset(torch.arange(SAMPLES), x, y)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def kill_during_save(folder, step):
    """A watcher: SIGKILL this rank as soon as its shard of that save exists (the save is unfinished)."""
    shard = os.path.join(folder, f".global_step{step}.partial", "rank_1_shard.pt")

    def watch():
        while not os.path.exists(shard):
            time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, daemon=True).start()


def main(folder, stop_at, last, kill_at=None):
    model = make_model()
    config = {**CONFIG, "train_batch_size": int(os.environ.get("ELASTIC_TBS", CONFIG["train_batch_size"]))}
    pause = float(os.environ.get("ELASTIC_STEP_SLEEP", "0"))
    engine, _, loader, _ = zero.initialize(model=model, training_data=dataset(), config=config)
    restart = os.environ.get("DSLAUNCH_RESTART_COUNT", "0")
    if kill_at is not None and restart == "0" and dist.get_rank() == 1:
        kill_during_save(folder, kill_at)
    if dist.get_rank() == 0 and os.path.exists(os.path.join(folder, "latest")):
        with open(os.path.join(folder, "latest"), encoding="utf-8") as handle:
            print(f"TRY {restart} LATEST {handle.read()} DIRS {sorted(os.listdir(folder))}", flush=True)
    engine.load_checkpoint(folder)
    world, gas = dist.get_world_size(), engine.gradient_accumulation_steps()
    steps, ids, loss_sum = [], [], torch.zeros(())
    while engine.global_steps < min(stop_at, last):
        for index, x, y in loader:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            ids += index.tolist()
            loss_sum += loss.detach()
            engine.backward(loss)
            boundary = engine.is_gradient_accumulation_boundary()
            engine.step()
            if not boundary:
                continue
            seen = [torch.zeros(len(ids), dtype=torch.long) for _ in range(world)]
            dist.all_gather(seen, torch.tensor(ids))  # every rank takes gas micro-batches per step
            dist.all_reduce(loss_sum)
            steps.append({"step": engine.global_steps, "ids": sorted(torch.cat(seen).tolist()),
                          "loss": loss_sum.item() / (gas * world), "world": world, "gas": gas})
            ids, loss_sum = [], torch.zeros(())
            if dist.get_rank() == 0:
                print(f"STEP {engine.global_steps} TRY {restart} WORLD {world}", flush=True)
            time.sleep(pause)
            if engine.global_steps % SAVE_EVERY == 0 and engine.global_steps < stop_at:
                engine.save_checkpoint(folder)
            if engine.global_steps >= min(stop_at, last):
                break
    if dist.get_rank() == 0:
        weights = [p.detach().flatten().tolist() for p in model.parameters()]
        print("RESULT " + json.dumps({"steps": steps, "weights": weights}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)

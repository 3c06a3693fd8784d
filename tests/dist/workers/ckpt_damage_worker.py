"""Rank side of the damaged-checkpoint tests: ``DIR MODE...``.

A damage MODE (truncated, bitflip, missing, legacy, explicit) saves tags global_step1 and
global_step2 (stage 2, so each rank's shard is its own), rank 0 damages global_step2 (or removes
every digest file: legacy), and a fresh engine calls load_checkpoint(DIR/MODE) (explicit: with
tag='global_step2'). Each rank writes ``MODE <name>`` to stderr first, so the test can tell its messages apart.
Rank 0 prints ``RESULT {json}``: per mode the tag loaded (or the error's type and text) and which save's
weights the engine holds.

``restart``: load_checkpoint(DIR) at start, train to step 6 saving every 2 steps; on the first try
(DSLAUNCH_RESTART_COUNT 0) rank 0 truncates rank 1's shard of global_step4 once it is saved and fails
(exit 3). Rank 0 prints ``TRY t FROM <tag> AT <step>`` after loading and ``DONE <step>`` at the end.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

from launcher import zero
from launcher.zero.errors import CheckpointError
from tests.helpers.damage import damage as hurt

SHARD = "rank_1_shard.pt"


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    engine, _, _, _ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}})
    return engine


def train_step(engine):
    engine.backward(engine(torch.ones(4, 8) * (dist.get_rank() + 1)).pow(2).mean())
    engine.step()


def weights(engine):
    return [p.detach().flatten().tolist() for p in engine.module.parameters()]


def damage(tag_dir, mode):
    if mode == "explicit":
        hurt(os.path.join(tag_dir, "model_states.pt"), "shortened")
    elif mode in ("truncated", "bitflip", "missing"):
        hurt(os.path.join(tag_dir, SHARD), mode)


def scenario(folder, mode):
    engine = build()
    saved = []
    for _ in range(2):
        train_step(engine)
        engine.save_checkpoint(folder)
        saved.append(weights(engine))
    if dist.get_rank() == 0:
        if mode == "legacy":
            for tag in ("global_step1", "global_step2"):
                os.remove(os.path.join(folder, tag, "digests.json"))
        else:
            damage(os.path.join(folder, "global_step2"), mode)
    dist.barrier()
    print(f"MODE {mode}", file=sys.stderr, flush=True)
    fresh = build()
    try:
        path, _ = fresh.load_checkpoint(folder, tag="global_step2" if mode == "explicit" else None)
        result = {"loaded": os.path.basename(path), "steps": fresh.global_steps}
    except CheckpointError as error:
        result = {"error": type(error).__name__, "message": str(error)}
    held = weights(fresh)
    result["weights"] = ["step1", "step2"][[w == held for w in saved].index(True)] if held in saved else "other"
    return result


def restart(folder):
    engine = build()
    first_try = os.environ.get("DSLAUNCH_RESTART_COUNT", "0") == "0"
    path, _ = engine.load_checkpoint(folder)
    if dist.get_rank() == 0:
        print(f"TRY {os.environ.get('DSLAUNCH_RESTART_COUNT')} FROM {path and os.path.basename(path)} "
              f"AT {engine.global_steps}", flush=True)
    while engine.global_steps < 6:
        train_step(engine)
        if engine.global_steps % 2 == 0:
            engine.save_checkpoint(folder)
        if first_try and engine.global_steps == 4:
            if dist.get_rank() == 0:
                damage(os.path.join(folder, "global_step4"), "truncated")
                sys.exit(3)
            dist.barrier()   # rank 1 waits there until the launcher stops it
    if dist.get_rank() == 0:
        print(f"DONE {engine.global_steps}", flush=True)


def main():
    folder, modes = sys.argv[1], sys.argv[2:]
    if modes == ["restart"]:
        restart(folder)
        return
    results = {mode: scenario(os.path.join(folder, mode), mode) for mode in modes}
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()

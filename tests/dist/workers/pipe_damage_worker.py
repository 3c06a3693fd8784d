"""Rank side of the damaged pipeline-checkpoint tests: ``DIR MODE...`` on 2 ranks (pipe 2 x data 1).

Each MODE (truncated, bitflip, missing, legacy, explicit) saves tags global_step1 and global_step2,
rank 0 damages stage 1's optimizer file of global_step2 (legacy: removes both tags' digests.json;
explicit: truncates stage 0's layer file, then load_checkpoint(tag='global_step2')), and a fresh engine loads DIR/MODE. Stage 1's file is read only
by rank 1: the test shows every rank agreeing on the tag and rank 0 alone saying so. Each rank writes
``MODE <name>`` to stderr first. Rank 0 prints ``RESULT {json}``: per mode the tag loaded (or the
error's type and text) and which save's weights this rank holds.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from launcher import zero
from launcher.zero.errors import CheckpointError
from launcher.zero.parallel.grid import ParallelGrid
from launcher.zero.parallel.topology import PipeModelDataParallelTopology
from launcher.zero.pipe import LayerSpec, PipelineModule
from tests.helpers.damage import damage as hurt

OPTIM_1 = "optim_pipe_01_model_00.pt"


def build():
    zero.init_distributed()
    grid = ParallelGrid(PipeModelDataParallelTopology(2, 1, 1))
    module = PipelineModule([LayerSpec(nn.Linear, 8, 16), LayerSpec(nn.Tanh), LayerSpec(nn.Linear, 16, 8)],
                            topology=grid, loss_fn=nn.functional.mse_loss, seed_layers=True, base_seed=7)
    engine, _, _, _ = zero.initialize(model=module, config={
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.05}}})
    return engine


def train_step(engine):
    generator = torch.Generator().manual_seed(engine.global_steps)
    batches = iter([(torch.randn(2, 8, generator=generator), torch.randn(2, 8, generator=generator))
                    for _ in range(2)])
    engine.train_batch(batches)


def weights(engine):
    return [p.detach().flatten().tolist() for p in engine.module.parameters()]


def damage(tag_dir, mode):
    if mode == "explicit":
        hurt(os.path.join(tag_dir, "layer_00-model_00-model_states.pt"), "shortened")
    else:
        hurt(os.path.join(tag_dir, OPTIM_1), mode)


def scenario(folder, mode):
    engine = build()
    saved = []
    for _ in range(2):
        train_step(engine)
        engine.save_checkpoint(folder)
        saved.append(weights(engine))
    if dist.get_rank() == 0 and mode == "legacy":
        for tag in ("global_step1", "global_step2"):
            os.remove(os.path.join(folder, tag, "digests.json"))
    elif dist.get_rank() == 0:
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
    result["weights"] = ["step1", "step2"][[w == held for w in saved].index(True)] if held in saved else "fresh"
    return result


def main():
    folder, modes = sys.argv[1], sys.argv[2:]
    results = {mode: scenario(os.path.join(folder, mode), mode) for mode in modes}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, results)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(every), flush=True)


if __name__ == "__main__":
    main()

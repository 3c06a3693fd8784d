"""Rank-side tensor-parallel parity: tensor 2 x data 2 through zero.initialize(mpu=...) vs. AdamW.

argv: comma-separated ZeRO stages [mode folder]. Prints one ``RESULT {json}`` per stage: the max abs
error of every shard against the matching slice of the single-process model, and both runs' norms.
Mode ``save`` runs 2 of the 4 steps and saves into ``folder/stage_<N>`` (and ``save_16bit_model``
into ``folder/stage_<N>/16bit``); ``resume`` loads that (at
any data size: accumulation 4 / data ranks keeps the global batch) and runs steps 3-4.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from launcher import zero
from launcher.zero.parallel.grid import ParallelGrid
from launcher.zero.parallel.tensor import apply_tensor_parallel, vocab_parallel_cross_entropy
from launcher.zero.parallel.topology import topology_for

STEPS, SAMPLES_PER_STEP, MBS, CLIP, LR, VOCAB = 4, 8, 2, 0.05, 0.05, 16
PLAN = {"emb": "vocab", "fc": "colwise", "proj": "rowwise", "head": "colwise"}


class Net(nn.Module):
    def __init__(self, group=None):
        super().__init__()
        torch.manual_seed(7)
        self.emb, self.fc, self.proj = nn.Embedding(VOCAB, 8), nn.Linear(8, 16), nn.Linear(16, 8)
        self.head = nn.Linear(8, VOCAB, bias=False)
        self.group = group

    def forward(self, ids, target):
        h = self.emb(ids)
        h = h + self.proj(torch.tanh(self.fc(h)))
        logits = self.head(h)
        if self.group is None:
            return F.cross_entropy(logits.flatten(0, 1), target.flatten())
        return vocab_parallel_cross_entropy(logits, target, self.group).mean()


def data(length=5):
    generator = torch.Generator().manual_seed(0)
    count = STEPS * SAMPLES_PER_STEP
    return (torch.randint(0, VOCAB, (count, length), generator=generator),
            torch.randint(0, VOCAB, (count, length), generator=generator))


def reference(dp, steps=STEPS):
    return adamw_reference(Net(), *data(), dp, steps)


def adamw_reference(net, x, y, dp, steps):
    """Single-process AdamW over the global batches that `dp` data ranks see; (net, clip norms)."""
    gas = SAMPLES_PER_STEP // (MBS * dp)
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    norms = []
    for step in range(steps):
        for micro in range(gas):
            for data_rank in range(dp):
                start = ((step * gas + micro) * dp + data_rank) * MBS
                (net(x[start:start + MBS], y[start:start + MBS]) / (gas * dp)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad()
    return net, norms


def run(stage, grid, mode="train", folder=None):
    group = grid.get_model_parallel_group()
    dp, data_rank = grid.get_data_parallel_world_size(), grid.get_data_parallel_rank()
    gas = SAMPLES_PER_STEP // (MBS * dp)
    model = apply_tensor_parallel(Net(group), PLAN, group)
    dims = {name: getattr(p, "partition_dim", None) for name, p in model.named_parameters()}
    local_params = sum(p.numel() for p in model.parameters())   # before stage 3 partitions them
    config = {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": gas, "gradient_clipping": CLIP,
              # threshold 20: at stage 3 the 16-element biases stay whole, every weight is partitioned
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 20,
                                    "stage3_gather_16bit_weights_on_model_save": True},
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.99], "eps": 1e-8,
                                                        "weight_decay": 0.01}}}
    engine, _, _, _ = zero.initialize(model=model, config=config, mpu=grid)
    x, y = data()
    first, last, extra = 0, STEPS // 2 if mode == "save" else STEPS, {}
    stage_folder = f"{folder}/stage_{stage}" if folder else None
    if mode == "resume":
        engine.load_checkpoint(stage_folder)
        first = engine.global_steps
        extra["consolidated_error"] = _consolidated_error(stage_folder, reference(dp, steps=first)[0])
    norms = []
    for step in range(first, last):
        for micro in range(gas):
            start = ((step * gas + micro) * dp + data_rank) * MBS
            engine.backward(engine(x[start:start + MBS], y[start:start + MBS]))
            engine.step()
        norms.append(engine.get_global_grad_norm())
    if mode == "save":
        engine.save_checkpoint(stage_folder)
        extra["saved_16bit"] = engine.save_16bit_model(f"{stage_folder}/16bit", "model.bin")
    ref, ref_norms = reference(dp, steps=last)
    ref_norms = ref_norms[first:]
    full, tp, tp_rank = dict(ref.named_parameters()), grid.get_model_parallel_world_size(), grid.get_model_parallel_rank()
    error = 0.0
    for name, value in engine.module_state_dict().items():
        expected = full[name].detach()
        if dims[name] is not None:
            expected = expected.chunk(tp, dim=dims[name])[tp_rank]
        error = max(error, (value.float() - expected).abs().max().item())
    return {"rank": int(os.environ["RANK"]), "stage": stage, "max_abs_error": error, "norms": norms, "dp": dp,
            "reference_norms": ref_norms, "local_params": local_params, "global_steps": engine.global_steps,
            "mp_world_size": engine.mp_world_size, "global_rank": engine.global_rank,
            "dp_world_size": engine.dp_world_size, "world_size": engine.world_size, **extra}


def _consolidated_error(folder, ref) -> float:
    """dslaunch-zero-to-fp32's full state dict (tensor shards joined) against the reference's weights."""
    state, expected = zero.get_fp32_state_dict_from_zero_checkpoint(folder), ref.state_dict()
    assert sorted(state) == sorted(expected), (sorted(state), sorted(expected))
    return max((state[name] - value).abs().max().item() for name, value in expected.items())


def main():
    zero.init_distributed()
    grid = ParallelGrid(topology_for(int(os.environ["WORLD_SIZE"]), model=2))
    mode, folder = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("train", None)
    for stage in [int(s) for s in sys.argv[1].split(",")]:
        print("RESULT " + json.dumps(run(stage, grid, mode, folder)), flush=True)


if __name__ == "__main__":
    main()

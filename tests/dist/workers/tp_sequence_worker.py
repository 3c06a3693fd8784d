"""Rank-side sequence-parallel parity: tensor 2 x data 2 through zero.initialize(mpu=...) vs. AdamW.

argv: comma-separated ZeRO stages. The net: a vocabulary-parallel embedding, ``scatter_sequence``,
a pre-norm MLP block (LayerNorm, column-parallel fc, row-parallel proj with bias, residual), a
LayerNorm and a column-parallel head (which gathers the sequence) into the vocabulary-parallel
cross-entropy. Prints one ``RESULT {json}`` per stage: the max abs error of every parameter (shards
against their slice) and both runs' clip norms.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from launcher import zero
from launcher.zero.parallel.grid import ParallelGrid
from launcher.zero.parallel.sequence import scatter_sequence
from launcher.zero.parallel.tensor import apply_tensor_parallel, vocab_parallel_cross_entropy
from launcher.zero.parallel.topology import topology_for

from tp_worker import CLIP, LR, MBS, SAMPLES_PER_STEP, STEPS, VOCAB, adamw_reference  # same run as tp_worker's
from tp_worker import data as tp_data

LENGTH = 6
PLAN = {"emb": "vocab", "norm1": "norm", "fc": "colwise", "proj": "rowwise", "norm2": "norm", "head": "colwise"}


class Net(nn.Module):
    def __init__(self, group=None):
        super().__init__()
        torch.manual_seed(7)
        self.emb, self.fc, self.proj = nn.Embedding(VOCAB, 8), nn.Linear(8, 16), nn.Linear(16, 8)
        self.norm1, self.norm2 = nn.LayerNorm(8), nn.LayerNorm(8)
        self.head = nn.Linear(8, VOCAB, bias=False)
        with torch.no_grad():            # norms away from 1 / 0, a bias away from 0: all of them matter
            for param in (*self.norm1.parameters(), *self.norm2.parameters(), self.proj.bias):
                param.add_(torch.randn_like(param) * 0.3)
        self.group = group

    def forward(self, ids, target):
        h = self.emb(ids)
        if self.group is not None:
            h = scatter_sequence(h, self.group)          # from here on each tensor rank holds 3 of 6 positions
        h = h + self.proj(torch.tanh(self.fc(self.norm1(h))))
        logits = self.head(self.norm2(h))                # the column-parallel head gathers the sequence
        if self.group is None:
            return F.cross_entropy(logits.flatten(0, 1), target.flatten())
        return vocab_parallel_cross_entropy(logits, target, self.group).mean()


def data():
    return tp_data(LENGTH)


def reference(dp):
    return adamw_reference(Net(), *data(), dp, STEPS)


def run(stage, grid):
    group = grid.get_model_parallel_group()
    dp, data_rank = grid.get_data_parallel_world_size(), grid.get_data_parallel_rank()
    gas = SAMPLES_PER_STEP // (MBS * dp)
    model = apply_tensor_parallel(Net(group), PLAN, group, sequence_parallel=True)
    dims = {name: getattr(p, "partition_dim", None) for name, p in model.named_parameters()}
    marked = sorted(name for name, p in model.named_parameters() if getattr(p, "sequence_parallel", False))
    config = {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": gas, "gradient_clipping": CLIP,
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 20},
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.99], "eps": 1e-8,
                                                        "weight_decay": 0.01}}}
    engine, _, _, _ = zero.initialize(model=model, config=config, mpu=grid)
    x, y = data()
    norms = []
    for step in range(STEPS):
        for micro in range(gas):
            start = ((step * gas + micro) * dp + data_rank) * MBS
            engine.backward(engine(x[start:start + MBS], y[start:start + MBS]))
            engine.step()
        norms.append(engine.get_global_grad_norm())
    ref, ref_norms = reference(dp)
    full, tp, tp_rank = dict(ref.named_parameters()), grid.get_model_parallel_world_size(), grid.get_model_parallel_rank()
    errors = {}
    for name, value in engine.module_state_dict().items():
        expected = full[name].detach()
        if dims[name] is not None:
            expected = expected.chunk(tp, dim=dims[name])[tp_rank]
        errors[name] = (value.float() - expected).abs().max().item()
    return {"rank": int(os.environ["RANK"]), "stage": stage, "max_abs_error": max(errors.values()),
            "worst": max(errors, key=errors.get), "norms": norms, "reference_norms": ref_norms, "marked": marked}


def main():
    zero.init_distributed()
    grid = ParallelGrid(topology_for(int(os.environ["WORLD_SIZE"]), model=2))
    for stage in [int(s) for s in sys.argv[1].split(",")]:
        print("RESULT " + json.dumps(run(stage, grid)), flush=True)


if __name__ == "__main__":
    main()

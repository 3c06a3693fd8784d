"""Rank-side tensor-parallel parity: tensor 2 x data 2 through zero.initialize(mpu=...) vs. AdamW.

argv: comma-separated ZeRO stages. Prints one ``RESULT {json}`` per stage: the max abs error of
every shard against the matching slice of the single-process model, and both runs' losses.
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

STEPS, GAS, MBS, CLIP, LR, VOCAB = 4, 2, 2, 0.05, 0.05, 16
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


def data(dp):
    generator = torch.Generator().manual_seed(0)
    count = STEPS * GAS * dp * MBS
    return (torch.randint(0, VOCAB, (count, 5), generator=generator),
            torch.randint(0, VOCAB, (count, 5), generator=generator))


def reference(dp):
    net = Net()
    optimizer = torch.optim.AdamW(net.parameters(), lr=LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    x, y = data(dp)
    norms = []
    for step in range(STEPS):
        for micro in range(GAS):
            for data_rank in range(dp):
                start = ((step * GAS + micro) * dp + data_rank) * MBS
                (net(x[start:start + MBS], y[start:start + MBS]) / (GAS * dp)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad()
    return net, norms


def run(stage, grid):
    group = grid.get_model_parallel_group()
    model = apply_tensor_parallel(Net(group), PLAN, group)
    dims = {name: getattr(p, "partition_dim", None) for name, p in model.named_parameters()}
    local_params = sum(p.numel() for p in model.parameters())   # before stage 3 partitions them
    config = {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": GAS, "gradient_clipping": CLIP,
              # threshold 20: at stage 3 the 16-element biases stay whole, every weight is partitioned
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 20},
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.99], "eps": 1e-8,
                                                        "weight_decay": 0.01}}}
    engine, _, _, _ = zero.initialize(model=model, config=config, mpu=grid)
    dp, data_rank = grid.get_data_parallel_world_size(), grid.get_data_parallel_rank()
    x, y = data(dp)
    norms = []
    for step in range(STEPS):
        for micro in range(GAS):
            start = ((step * GAS + micro) * dp + data_rank) * MBS
            engine.backward(engine(x[start:start + MBS], y[start:start + MBS]))
            engine.step()
        norms.append(engine.get_global_grad_norm())
    try:
        engine.save_checkpoint("/nonexistent-never-written")
        refused = False
    except ImportError as error:   # NotSupportedError: tensor ranks would overwrite each other's files
        refused = "tensor-parallel" in str(error)
    ref, ref_norms = reference(dp)
    full, tp, tp_rank = dict(ref.named_parameters()), grid.get_model_parallel_world_size(), grid.get_model_parallel_rank()
    error = 0.0
    for name, value in engine.module_state_dict().items():
        expected = full[name].detach()
        if dims[name] is not None:
            expected = expected.chunk(tp, dim=dims[name])[tp_rank]
        error = max(error, (value.float() - expected).abs().max().item())
    return {"rank": int(os.environ["RANK"]), "stage": stage, "max_abs_error": error, "norms": norms,
            "reference_norms": ref_norms, "local_params": local_params, "checkpoint_refused": refused}


def main():
    zero.init_distributed()
    grid = ParallelGrid(topology_for(int(os.environ["WORLD_SIZE"]), model=2))
    for stage in [int(s) for s in sys.argv[1].split(",")]:
        print("RESULT " + json.dumps(run(stage, grid)), flush=True)


if __name__ == "__main__":
    main()

"""Rank-side check: an MoE model trained by the engine at ep_size N equals the same at ep 1.

argv: ep_size, precision (fp32 | bf16 | fp16), stages (comma-separated). For each stage every rank
trains the model twice through ``zero.initialize`` (optimizer from the config, so the engine
splits the expert param groups itself), once with every expert on every rank (ep 1) and once
with the experts spread over the expert group (ep N), on its own batches and gate draws, with
gradient clipping that bites. One ``RESULT {json}`` line per stage: the largest difference of the
weights after the steps (dense: the same names; experts: this rank's experts against the same
global experts of ep 1), the losses, and how far the weights moved.
"""
import json
import os
import sys

import torch

from launcher import zero
from launcher.zero.moe.layer import MoE
from launcher.zero.utils import groups

HIDDEN, EXPERTS, STEPS = 8, 4, 5


class Net(torch.nn.Module):
    def __init__(self, ep_size: int):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(6, HIDDEN)
        expert = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 16), torch.nn.GELU(), torch.nn.Linear(16, HIDDEN))
        self.moe = MoE(HIDDEN, expert, num_experts=EXPERTS, ep_size=ep_size, k=2, capacity_factor=1.0)
        self.out = torch.nn.Linear(HIDDEN, 3)

    def forward(self, x):
        hidden, l_aux, _ = self.moe(torch.relu(self.inp(x)))
        return self.out(hidden), l_aux


def config(stage: int, precision: str) -> dict:
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 0.05,
           "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}, "steps_per_print": 1000,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 200}}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return cfg


def train(ep_size: int, stage: int, precision: str, rank: int):
    net = Net(ep_size)
    first = (rank % ep_size) * (EXPERTS // ep_size)   # E + D order: expert rank = rank % ep_size
    with torch.no_grad():    # experts start as copies: make them differ, alike at any ep_size
        for index, local in enumerate(net.moe.deepspeed_moe.experts.deepspeed_experts):
            for param in local.parameters():
                param.add_(0.05 * (first + index))
    before = {name: p.detach().float().clone() for name, p in net.named_parameters()}
    engine, _, _, _ = zero.initialize(model=net, config=config(stage, precision))
    dtype = next(engine.module.parameters()).dtype
    data = torch.Generator().manual_seed(100 + rank)
    losses = []
    for step in range(STEPS * 2):
        x = torch.randn(4, 6, generator=data).to(dtype)
        target = torch.randn(4, 3, generator=data)
        torch.manual_seed(1000 * rank + step)     # the gate's draws: alike at any ep_size
        out, l_aux = engine(x)
        loss = torch.nn.functional.mse_loss(out.float(), target) + 0.01 * l_aux
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    after = {name: p.detach().float().clone() for name, p in engine.module.named_parameters()}
    moved = max(float((after[n] - before[n]).abs().max()) for n in after)
    info = {"expert_ranks": groups._get_expert_parallel_group_ranks(f"ep_size_{ep_size}"),
            "expert_data_ranks": groups._get_expert_data_parallel_group_ranks(f"ep_size_{ep_size}"),
            "groups": [(g["name"], g.get("moe", False)) for g in engine.optimizer.param_groups]}
    engine.destroy()
    return after, losses, moved, first, info


def expert_key(name: str, offset: int) -> str:
    head, _, tail = name.partition("deepspeed_experts.")
    if not tail:
        return name
    index, _, rest = tail.partition(".")
    return f"{head}deepspeed_experts.{int(index) + offset}.{rest}"


def main():
    ep_size, precision, stages = int(sys.argv[1]), sys.argv[2], [int(s) for s in sys.argv[3].split(",")]
    rank = int(os.environ["RANK"])
    for stage in stages:
        reference, ref_losses, _, _, _ = train(1, stage, precision, rank)
        ours, losses, moved, first, info = train(ep_size, stage, precision, rank)
        errors = {name: float((value - reference[expert_key(name, first)]).abs().max()) for name, value in ours.items()}
        expert_errors = [v for n, v in errors.items() if "deepspeed_experts" in n]
        print("RESULT " + json.dumps({"stage": stage, "precision": precision, "rank": rank,
                                      "weights": max(errors.values()), "experts": max(expert_errors),
                                      "losses": max(abs(a - b) for a, b in zip(losses, ref_losses)),
                                      "moved": moved, "local_experts": len(expert_errors) // 4,
                                      "loss_first_last": [losses[0], losses[-1]], **info}), flush=True)


if __name__ == "__main__":
    main()

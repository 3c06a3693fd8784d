"""ZeRO-3 leaf modules (``deepspeed.utils.set_z3_leaf_modules``) on 2 gloo ranks.

A mixture-of-experts block runs only the experts its tokens are routed to, and the routing here
sends rank 0's tokens to experts 0-1 and rank 1's to experts 1-3: without the leaf flag each rank
would gather (and reduce) a different set of parameters. With the block flagged as a leaf, the
losses and the trained weights match the same run at ZeRO-0 (no partitioning, nothing gathered).
"""
import json
import os

import pytest

STEPS, MBS, WIDTH, EXPERTS, LR = 4, 6, 8, 4, 0.02


def make_model():
    import torch
    import torch.nn as nn

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(EXPERTS))

        def forward(self, x, route):
            out = torch.zeros_like(x)
            for e in route.unique().tolist():       # only the experts some token goes to
                mask = route == e
                out[mask] = self.experts[e](x[mask])
            return out

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.moe, self.out = nn.Linear(WIDTH, WIDTH), Experts(), nn.Linear(WIDTH, 1)

        def forward(self, x, route):
            return self.out(torch.tanh(self.moe(torch.tanh(self.inp(x)), route)))

    torch.manual_seed(0)
    return Net()


def batch(rank, step):
    import torch
    g = torch.Generator().manual_seed(100 * step + rank)
    x, y = torch.randn(MBS, WIDTH, generator=g), torch.randn(MBS, 1, generator=g)
    route = torch.tensor([0, 1] * (MBS // 2) if rank == 0 else [1, 2, 3] * (MBS // 3))
    return x, y, route


def train(stage, leaf):
    """Per-step losses and the trained full weights of ``make_model`` at ``stage``."""
    import torch
    from launcher import zero
    from launcher.zero.utils import get_z3_leaf_modules, set_z3_leaf_modules

    rank = int(os.environ["RANK"])
    model = make_model()
    if leaf:
        set_z3_leaf_modules(model, ["Experts"])
    engine, _, _, _ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": MBS,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}}})
    losses = []
    for step in range(STEPS):
        x, y, route = batch(rank, step)
        loss = torch.nn.functional.mse_loss(engine(x, route), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    weights = {}
    for name, p in model.named_parameters():
        with zero.GatheredParameters([p]):
            weights[name] = p.detach().clone()
    leaves = len(get_z3_leaf_modules(model))
    engine.destroy()
    return losses, weights, leaves


def main():
    rank = int(os.environ["RANK"])
    plain_losses, plain_weights, _ = train(0, leaf=False)
    losses, weights, leaves = train(3, leaf=True)
    print("RESULT " + json.dumps({
        "rank": rank, "leaves": leaves, "losses": losses, "plain_losses": plain_losses,
        "loss_gap": max(abs(a - b) for a, b in zip(losses, plain_losses)),
        "weight_gap": max((weights[n] - plain_weights[n]).abs().max().item() for n in weights)}), flush=True)


def test_a_leaf_moe_block_with_experts_unused_on_a_rank_trains_as_at_zero0():
    from tests.helpers.world import check, run_world

    results = check(run_world(__file__, 2, timeout=120))
    for result in results:
        (record,) = result.records()
        assert record["leaves"] == 1
        assert record["loss_gap"] < 1e-6, record
        assert record["weight_gap"] < 1e-5, record


if __name__ == "__main__":
    main()

"""MoE parity material shared by the DeepSpeed recording script and our tests (torch only).

``LAYER_CASES`` are MoE layer settings; ``run_layer_case(MoE, case)`` builds one with a fixed seed,
runs two training (or eval) forwards and backwards on fixed inputs and returns what a user sees
(outputs, ``l_aux``, ``exp_counts``) and the gradients. ``scripts/record_deepspeed_moe.py`` runs it
with DeepSpeed's ``MoE`` into ``tests/data/deepspeed-0.19.8/moe_layer.json``; the tests with ours.

``CifarMoENet`` is the network of DeepSpeed's CIFAR-10 tutorial with ``--moe`` (two convolutions,
three linear layers, one MoE layer per ``--num-experts`` entry sharing one ``fc3`` expert), and
``synthetic_cifar`` stands in for the data set (random 3x32x32 images, no download).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN = 8
TOKENS = (4, 6)           # a [batch, sequence] of tokens: 24 per forward

LAYER_CASES = [
    dict(name="top1", num_experts=4, k=1),
    dict(name="top1_rsample", num_experts=4, k=1, noisy_gate_policy="RSample"),
    dict(name="top1_jitter", num_experts=4, k=1, noisy_gate_policy="Jitter"),
    dict(name="top1_no_rts", num_experts=4, k=1, use_rts=False, capacity_factor=0.5),
    dict(name="top1_no_drop", num_experts=4, k=1, drop_tokens=False),
    dict(name="top1_eval", num_experts=4, k=1, eval_capacity_factor=0.5, mode="eval"),
    dict(name="top1_used_token", num_experts=4, k=1, used_token=True),
    dict(name="top1_min_capacity_0", num_experts=8, k=1, min_capacity=0, capacity_factor=0.75),
    dict(name="top2", num_experts=4, k=2),
    dict(name="top2_no_sampling_drops", num_experts=4, k=2, top2_2nd_expert_sampling=False, capacity_factor=0.5),
    dict(name="top2_no_drop", num_experts=4, k=2, drop_tokens=False),
    dict(name="top2_jitter_mlp", num_experts=4, k=2, noisy_gate_policy="Jitter", expert="mlp", min_capacity=0),
    dict(name="top3_drops", num_experts=6, k=3, capacity_factor=0.5),
    dict(name="top3_no_drop", num_experts=6, k=3, drop_tokens=False),
    dict(name="residual_top1_mlp", num_experts=4, k=1, use_residual=True, expert="mlp"),
    dict(name="residual_top2", num_experts=2, k=2, use_residual=True),
    dict(name="top2_bf16", num_experts=4, k=2, dtype="bfloat16"),
]

LAYER_ARGS = ("num_experts", "k", "capacity_factor", "eval_capacity_factor", "min_capacity", "use_residual",
              "noisy_gate_policy", "drop_tokens", "use_rts", "top2_2nd_expert_sampling")


def make_expert(kind: str) -> nn.Module:
    if kind == "mlp":
        return nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.ReLU(), nn.Linear(2 * HIDDEN, HIDDEN))
    return nn.Linear(HIDDEN, HIDDEN)


def build_layer(moe_class, case: dict, seed: int = 1234, **extra):
    """The case's layer, built under ``seed`` (expert first, then the MoE, as scripts do)."""
    torch.manual_seed(seed)
    expert = make_expert(case.get("expert", "linear"))
    layer = moe_class(hidden_size=HIDDEN, expert=expert, **{k: case[k] for k in LAYER_ARGS if k in case}, **extra)
    return layer.to(getattr(torch, case.get("dtype", "float32")))


def case_inputs(case: dict, forwards: int = 2):
    """Fixed inputs (``forwards`` batches), the probe weighting the outputs in the loss, used_token masks."""
    gen = torch.Generator().manual_seed(99)
    dtype = getattr(torch, case.get("dtype", "float32"))
    batches = [torch.randn(*TOKENS, HIDDEN, generator=gen).to(dtype) for _ in range(forwards)]
    probe = torch.randn(*TOKENS, HIDDEN, generator=gen)
    used = [(torch.rand(TOKENS[0] * TOKENS[1], generator=gen) > 0.25).float() if case.get("used_token") else None
            for _ in range(forwards)]
    return batches, probe, used


def run_layer_case(moe_class, case: dict, forwards: int = 2, **extra) -> dict:
    """Forward and backward ``forwards`` times (no reseeding in between: draws follow on); returns
    per forward the output, l_aux and exp_counts, then the gradients of the inputs and parameters."""
    layer = build_layer(moe_class, case, **extra)
    layer.train(case.get("mode", "train") == "train")
    batches, probe, used = case_inputs(case, forwards)
    torch.manual_seed(4321)
    results = {"initial": {name: p.detach().float().flatten().tolist() for name, p in layer.named_parameters()},
               "forwards": []}
    grads = []
    for batch, used_token in zip(batches, used):
        batch = batch.clone().requires_grad_(True)
        output, l_aux, exp_counts = layer(batch, used_token) if used_token is not None else layer(batch)
        loss = (output.float() * probe).sum() + 0.1 * l_aux
        loss.backward()
        grads.append(batch.grad.float().flatten().tolist())
        results["forwards"].append({"output": output.detach().float().flatten().tolist(), "l_aux": l_aux.item(),
                                    "exp_counts": exp_counts.detach().tolist()})
    results["input_grads"] = grads
    results["param_grads"] = {name: p.grad.float().flatten().tolist() for name, p in layer.named_parameters()
                              if p.grad is not None}
    return results


# ---- the CIFAR-10 tutorial's network --------------------------------------------------------

class CifarMoENet(nn.Module):
    """DeepSpeed's CIFAR-10 tutorial model with ``--moe``: conv-pool x2, fc1, fc2, one MoE layer per
    entry of ``num_experts`` (all built from the one ``fc3`` expert), fc4."""

    def __init__(self, moe_class, num_experts=(2,), ep_size=1, k=1, min_capacity=0, noisy_gate_policy=None,
                 mlp_type="standard", **moe_extra):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        fc3 = nn.Linear(84, 84)
        self.moe_layer_list = nn.ModuleList([
            moe_class(hidden_size=84, expert=fc3, num_experts=n, ep_size=ep_size, use_residual=mlp_type == "residual",
                      k=k, min_capacity=min_capacity, noisy_gate_policy=noisy_gate_policy, **moe_extra)
            for n in num_experts])
        self.fc4 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc2(F.relu(self.fc1(x))))
        for layer in self.moe_layer_list:
            x, _, _ = layer(x)
        return self.fc4(x)


def synthetic_cifar(steps: int, batch_size: int, seed: int = 0):
    """``steps`` batches of 3x32x32 images in [-1, 1]: each is half its class's fixed random pattern
    (10 classes), half noise, so the loss has something to learn in a few steps."""
    gen = torch.Generator().manual_seed(seed)
    patterns = torch.rand(10, 3, 32, 32, generator=gen) * 2 - 1
    labels = torch.randint(0, 10, (steps * batch_size,), generator=gen)
    images = 0.5 * patterns[labels] + 0.5 * (torch.rand(steps * batch_size, 3, 32, 32, generator=gen) * 2 - 1)
    return [(images[i * batch_size:(i + 1) * batch_size], labels[i * batch_size:(i + 1) * batch_size])
            for i in range(steps)]


# The tutorial's runs (its --moe options), each recorded from DeepSpeed with TUTORIAL_CONFIG.
TUTORIAL_RUNS = [
    dict(name="top1_rsample", num_experts=[2], k=1, noisy_gate_policy="RSample", min_capacity=0),
    dict(name="top2_residual_two_layers", num_experts=[2, 4], k=2, mlp_type="residual", min_capacity=0),
]
TUTORIAL_STEPS, TUTORIAL_BATCH, TUTORIAL_SEED = 40, 16, 42
TUTORIAL_CONFIG = {
    "train_batch_size": TUTORIAL_BATCH,
    "steps_per_print": 1000,
    "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                             "weight_decay": 3e-7, "torch_adam": True}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                 "warmup_num_steps": 10}},
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 0},
}


def tutorial_net(moe_class, run: dict, **moe_extra):
    torch.manual_seed(TUTORIAL_SEED)
    options = {k: run[k] for k in ("k", "noisy_gate_policy", "min_capacity", "mlp_type") if k in run}
    return CifarMoENet(moe_class, num_experts=run["num_experts"], **options, **moe_extra)


def moe_param_groups(net, split):
    """The tutorial's ``--moe-param-group``: one named group, split into dense and expert groups."""
    return split({"params": [p for p in net.parameters()], "name": "parameters"})

"""Our MoE layer against what real DeepSpeed 0.19.8 did, recorded by scripts/record_deepspeed_moe.py.

Same seed, same inputs: DeepSpeed's layer and ours must draw the same initial weights, route the
same tokens (``exp_counts``), give the same outputs, ``l_aux`` and gradients, and the CIFAR-10
tutorial's network (``--moe`` options) must train to the same per-step losses. The training here
is a plain loop doing what DeepSpeed's engine does at ZeRO stage 0 on one rank (AdamW from
``torch_adam``, WarmupLR, its gradient clipping); through our engine is the next phase.
"""
import json
import math
from pathlib import Path

import pytest
import torch

from launcher.zero.experts import MoE, split_params_into_different_moe_groups_for_optimizer
from tests.helpers import moe_cases

DATA = Path(__file__).resolve().parents[2] / "data" / "deepspeed-0.19.8"
LAYER = json.loads((DATA / "moe_layer.json").read_text())
CIFAR = json.loads((DATA / "moe_cifar.json").read_text())


def _max_error(ours, theirs) -> float:
    """Max abs difference, both read as float32 (the file keeps the shortest decimal of each float32)."""
    ours, theirs = torch.tensor(ours).double(), torch.tensor(theirs).double()
    assert ours.shape == theirs.shape
    return float((ours - theirs).abs().max()) if ours.numel() else 0.0


@pytest.mark.parametrize("recorded", LAYER["cases"], ids=[c["case"]["name"] for c in LAYER["cases"]])
def test_layer_matches_deepspeed(recorded):
    case = recorded["case"]
    ours = moe_cases.run_layer_case(MoE, case)
    # fp32 matches to the last bit on the machine that recorded it; the bound leaves room for
    # another CPU's kernels. bf16 outputs round to 8 bits of mantissa.
    tolerance = 2e-2 if case.get("dtype") == "bfloat16" else 1e-5
    for name, digest in recorded["initial"].items():
        assert abs(sum(ours["initial"][name]) - digest["sum"]) < 1e-5, name        # same initial weights
    errors = {"output": 0.0, "l_aux": 0.0, "input grad": 0.0, "param grad": 0.0}
    for mine, theirs, my_grad, their_grad in zip(ours["forwards"], recorded["forwards"], ours["input_grads"],
                                                 recorded["input_grads"]):
        assert mine["exp_counts"] == theirs["exp_counts"]
        errors["output"] = max(errors["output"], _max_error(mine["output"], theirs["output"]))
        errors["l_aux"] = max(errors["l_aux"], _max_error([mine["l_aux"]], [theirs["l_aux"]]))
        errors["input grad"] = max(errors["input grad"], _max_error(my_grad, their_grad))
    assert sorted(ours["param_grads"]) == sorted(recorded["param_grads"])
    for name, grad in recorded["param_grads"].items():
        errors["param grad"] = max(errors["param grad"], _max_error(ours["param_grads"][name], grad))
    print(case["name"], {key: f"{value:.1e}" for key, value in errors.items()})
    assert max(errors.values()) <= tolerance, errors


def warmup_lr(step: int, params: dict) -> float:
    """DeepSpeed's WarmupLR (log warm-up) as its engine applies it: the scheduler steps after the
    optimizer, so update ``step`` (0-based) uses iteration ``step - 1``, and update 0 the minimum."""
    low, high, warmup = params["warmup_min_lr"], params["warmup_max_lr"], params["warmup_num_steps"]
    iteration = step - 1
    if iteration < 0:
        return low
    gamma = math.log(iteration + 1) / math.log(warmup) if iteration < warmup else 1.0
    return low + (high - low) * gamma


def clip_like_deepspeed(parameters, max_norm: float) -> None:
    """Stage 0 fp32 clipping: the norm of the per-parameter norms; scale by max / (norm + 1e-6) if < 1."""
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.stack([g.detach().float().norm(2) for g in grads]).pow(2).sum().float().pow(0.5)
    coefficient = torch.min(torch.tensor([1.0]), torch.tensor([float(max_norm)]) / (total + 1e-6))
    for grad in grads:
        grad.mul_(coefficient)


def train_tutorial(run: dict):
    config = CIFAR["config"]
    net = moe_cases.tutorial_net(MoE, run)
    groups = moe_cases.moe_param_groups(net, split_params_into_different_moe_groups_for_optimizer)
    adam = dict(config["optimizer"]["params"])
    adam.pop("torch_adam")
    optimizer = torch.optim.AdamW(groups, **adam)
    criterion = torch.nn.CrossEntropyLoss()
    losses, lrs = [], []
    torch.manual_seed(moe_cases.TUTORIAL_SEED + 1)
    for step, (images, labels) in enumerate(moe_cases.synthetic_cifar(CIFAR["steps"], CIFAR["batch_size"])):
        lrs.append(warmup_lr(step, config["scheduler"]["params"]))
        for group in optimizer.param_groups:
            group["lr"] = lrs[-1]
        loss = criterion(net(images), labels)
        loss.backward()
        clip_like_deepspeed(net.parameters(), config["gradient_clipping"])
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return net, optimizer, losses, lrs


@pytest.fixture
def one_thread():
    """Tiny convolutions run 5-20x slower on two threads of a shared, loaded machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("recorded", CIFAR["runs"], ids=[r["run"]["name"] for r in CIFAR["runs"]])
def test_cifar_tutorial_trains_like_deepspeed(recorded, one_thread):
    net, optimizer, losses, lrs = train_tutorial(recorded["run"])
    assert [(g["name"], g.get("moe", False), len(g["params"])) for g in optimizer.param_groups] == \
        [(g["name"], g["moe"], g["size"]) for g in recorded["param_groups"]]
    assert lrs == pytest.approx(recorded["lrs"], abs=1e-12)
    loss_error = max(abs(a - b) for a, b in zip(losses, recorded["losses"]))
    weights = {name: p.detach().double() for name, p in net.named_parameters()}
    weight_error = max(abs(float(weights[name].sum()) - d["sum"]) + abs(float(weights[name].norm()) - d["norm"])
                       for name, d in recorded["final"].items())
    print(recorded["run"]["name"], f"max loss error {loss_error:.1e} over {len(losses)} steps, "
          f"final weight digest error {weight_error:.1e}, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert sorted(weights) == sorted(recorded["final"])
    assert loss_error < 1e-5 and weight_error < 1e-4

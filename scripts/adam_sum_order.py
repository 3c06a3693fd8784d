#!/usr/bin/env python3
"""How far DeepSpeed moves from itself when only the order of a gradient sum changes (issue 41 item 5).

DeepSpeedExamples' ``training/pipeline_parallelism/train.py -p 0`` (AlexNet, fp32, Adam, 16
micro-batches a step on 2 ranks) gave 22.43374 on our engine and 22.43298 on DeepSpeed at step 2
(3.4e-5 relative), where other fp32 cases agree to 5e-7. This script trains the same shape of run
(an AlexNet-shaped CNN, fp32, DeepSpeed's "Adam", ``gradient_accumulation_steps`` 16, 2 ranks,
fixed synthetic images) through ``import deepspeed`` and records every micro-batch's loss and the
first step's update. ``--order reverse`` feeds each step's 16 micro-batches in the opposite order:
the same gradient sum in another order, so the same mathematics with other roundings. Run it on a
real DeepSpeed (both orders) and under ``dslaunch --as-deepspeed``, and compare:

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 scripts/adam_sum_order.py \\
        --order forward --report ds-forward.json
    dslaunch --as-deepspeed --num_gpus 2 --no_local_rank scripts/adam_sum_order.py --report ours.json

Dropout is off (``--dropout 0``, the default here): with it on, a reordered step would also draw its
masks for other images, which is not a rounding difference. Adam's first update is lr x m / (sqrt(v)
+ eps) = lr x sign(g) wherever |g| >> eps, whatever g's size: a gradient that sums to nearly zero
turns its rounding into a full step of lr. ``--report`` records how many weights had such a gradient
(|g| < 1e-6 x the largest) and the loss per micro-batch.
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import deepspeed
from alexnet_data_path import alexnet_shaped   # torchvision's AlexNet, written once (scripts/)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--order", choices=("forward", "reverse"), default="forward")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro", type=int, default=8, help="images per micro-batch per rank")
    p.add_argument("--gas", type=int, default=16)
    p.add_argument("--size", type=int, default=128, help="image side (train.py: 224)")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--report", required=True)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(1138)
    net = alexnet_shaped(dropout=args.dropout)
    config = {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": args.gas,
              "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8}},
              "steps_per_print": 1000}
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    gen = torch.Generator().manual_seed(7 + rank)   # each rank its own images, the same in every run
    images = torch.randn(args.steps, args.gas, args.micro, 3, args.size, args.size, generator=gen)
    labels = torch.randint(0, 10, (args.steps, args.gas, args.micro), generator=gen)
    before = [p.detach().clone() for p in net.parameters()]
    losses, near_zero = [], None
    for step in range(args.steps):
        order = range(args.gas) if args.order == "forward" else reversed(range(args.gas))
        step_losses = {}
        for micro in order:
            loss = torch.nn.functional.cross_entropy(engine(images[step, micro]), labels[step, micro])
            engine.backward(loss)
            if micro == (args.gas - 1 if args.order == "forward" else 0) and step == 0:
                near_zero = count_near_zero(net)
            engine.step()
            step_losses[micro] = loss.item()
        losses.append([step_losses[m] for m in range(args.gas)])   # in micro-batch order, whatever the feed
    moved = [(p.detach() - b).abs().max().item() for p, b in zip(net.parameters(), before)]
    if rank == 0:
        with open(args.report, "w") as f:
            json.dump({"engine": "ours" if hasattr(deepspeed, "_dslaunch") or "launcher" in deepspeed.__file__
                       else f"deepspeed {deepspeed.__version__}", "order": args.order, "world": world,
                       "size": args.size, "losses": losses, "near_zero_grads": near_zero,
                       "largest_update": max(moved)}, f, indent=1)


def count_near_zero(net: torch.nn.Module) -> dict | None:
    """Weights whose accumulated gradient (before the step) is tiny next to the largest: where Adam's
    first step is a full lr in a direction the rounding picks. None where the engine keeps no .grad."""
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    if not grads:
        return None
    flat = torch.cat([g.reshape(-1).abs() for g in grads])
    return {"weights": flat.numel(), "below_1e-6_of_max": int((flat < 1e-6 * flat.max()).sum()),
            "exactly_zero": int((flat == 0).sum())}


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

#!/usr/bin/env python3
"""How far DeepSpeed moves from itself when only the order of a gradient sum changes (issue 41 item 5).

DeepSpeedExamples' ``training/pipeline_parallelism/train.py -p 0`` (AlexNet, fp32, Adam, 16
micro-batches a step on 2 ranks) gave 22.43374 on our engine and 22.43298 on DeepSpeed at step 2
(3.4e-5 relative), where other fp32 cases agree to 5e-7. This script trains the same shape of run
(torchvision's AlexNet layer for layer, fp32, DeepSpeed's "Adam" lr 1e-3, ``gradient_accumulation_steps``
16, 8 images a micro-batch, 2 ranks, seed 1138) through ``import deepspeed`` and records every
micro-batch's loss on every rank. ``--order reverse`` feeds each step's 16 micro-batches in the
opposite order: the same gradient sum in another order, so the same mathematics with other roundings.
Run it on a real DeepSpeed (both orders) and under ``dslaunch --as-deepspeed`` (both orders), then
``--compare`` prints the three gaps: ours vs DeepSpeed, DeepSpeed vs itself reversed, ours vs itself
reversed:

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 scripts/adam_sum_order.py \\
        --order forward --report ds-forward.json
    dslaunch --as-deepspeed --num_gpus 2 --no_local_rank scripts/adam_sum_order.py --report ours.json
    python scripts/adam_sum_order.py --compare ds-forward.json ds-reverse.json ours.json ours-reverse.json
    python scripts/adam_sum_order.py --gap ds-noise.json ds-forward.json     # any two reports
    python scripts/adam_sum_order.py --flips ds-weights.pt ours-weights.pt   # two --save-weights files

Inputs: fixed ``randn`` images of ``--size`` (the default), or ``--inputs FILE.npy`` from
``scripts/cifar_like_images.py`` (32 x 32 images through the example's Resize(256) and
CenterCrop(224)), which this script turns into tensors as the example's ToTensor and Normalize do.
With ``--dropout`` above 0 (AlexNet's is 0.5) the global RNG is reseeded before every micro-batch
from (step, micro-batch), so a reversed step draws each image's masks as the forward one does and
the orders still differ only in rounding. Adam's first update is lr x m / (sqrt(v) + eps) =
lr x sign(g) wherever |g| >> eps, whatever g's size: a gradient that sums to nearly zero turns its
rounding into a full step of lr. The report counts such gradients (|g| < 1e-6 x the largest).

``--grad-noise EPS`` perturbs every micro-batch gradient by a relative EPS, ``--no-mkldnn`` computes
the convolutions by another fp32 algorithm and ``--conv-tf32`` cuts their operands to TF32, to see
what kind of difference a given loss gap needs; ``--save-weights`` keeps the weights after step 1
and ``--flips`` counts the updates two runs took in opposite directions. On GPUs (``--backend
nccl``, one GPU a rank) ``--cudnn-strict`` turns off TF32 convolutions (torch's default for cuDNN)
and nondeterministic cuDNN algorithms, to tell the GPU's own rounding from an engine difference.
Findings: benchmarks/RESULTS.md, "2026-12-07 afternoon: issue 41 item 5".
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)   # train.py's Normalize


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--order", choices=("forward", "reverse"), default="forward")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro", type=int, default=8, help="images per micro-batch per rank")
    p.add_argument("--gas", type=int, default=16)
    p.add_argument("--size", type=int, default=128, help="image side of the randn inputs (train.py: 224)")
    p.add_argument("--inputs", default=None, help="a .npy of uint8 images from scripts/cifar_like_images.py")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--grad-noise", type=float, default=0.0, metavar="EPS",
                   help="multiply every micro-batch gradient by 1 + EPS x N(0, 1), fixed per (step, micro-batch, "
                        "parameter): how much a rounding-sized change in the gradients moves the later losses")
    p.add_argument("--conv-tf32", choices=("off", "round", "truncate"), default="off",
                   help="CPU stand-in for a GPU's TF32 convolutions: round (to nearest) or truncate every "
                        "convolution's input and weight to TF32's 10-bit mantissa, forward and backward")
    p.add_argument("--no-mkldnn", action="store_true",
                   help="CPU: convolutions by torch's own im2col + GEMM instead of oneDNN; the same fp32 "
                        "mathematics by another algorithm, as a GPU's cuDNN may pick another")
    p.add_argument("--save-weights", default=None, metavar="PATH",
                   help="rank 0 writes every weight after the first step, flat, to PATH (torch.save; 228 MB at AlexNet)")
    p.add_argument("--backend", default="gloo", help="nccl on GPUs")
    p.add_argument("--cudnn-strict", action="store_true",
                   help="GPU only: cuDNN convolutions in true fp32 (no TF32) and deterministic (torch's defaults: "
                        "TF32 on, algorithms free), to tell GPU rounding from an engine difference")
    p.add_argument("--report", required=True)
    return p.parse_args()


class Inputs:
    """Each rank's images and labels for (step, micro-batch), the same in every run and either order."""

    def __init__(self, args: argparse.Namespace, rank: int):
        self.micro, self.gas, self.size = args.micro, args.gas, args.size
        per_rank = args.steps * args.gas * args.micro
        if args.inputs:
            self.images = np.load(args.inputs, mmap_mode="r")
            self.labels = torch.from_numpy(np.load(args.inputs.removesuffix(".npy") + ".labels.npy"))
            self.first = rank * per_rank
            if len(self.images) < (rank + 1) * per_rank:
                raise SystemExit(f"{args.inputs}: {len(self.images)} images, this run needs {2 * per_rank}")
        else:
            self.images, self.seed = None, 7 + rank   # each rank its own images

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.images is None:
            gen = torch.Generator().manual_seed(self.seed * 100_000 + step * self.gas + micro)
            return (torch.randn(self.micro, 3, self.size, self.size, generator=gen),
                    torch.randint(0, 10, (self.micro,), generator=gen))
        start = self.first + (step * self.gas + micro) * self.micro
        pixels = torch.from_numpy(np.array(self.images[start:start + self.micro])).float().div(255)   # ToTensor
        pixels = pixels.sub(torch.tensor(MEAN).view(3, 1, 1)).div(torch.tensor(STD).view(3, 1, 1))   # Normalize
        return pixels, self.labels[start:start + self.micro]


def train(args: argparse.Namespace) -> dict:
    import deepspeed
    from alexnet_data_path import alexnet_shaped   # torchvision's AlexNet, written once (scripts/)
    rank = torch.distributed.get_rank()
    torch.manual_seed(1138)
    net = alexnet_shaped(dropout=args.dropout)
    if args.conv_tf32 != "off":
        as_tf32_convolutions(net, args.conv_tf32)
    config = {"train_micro_batch_size_per_gpu": args.micro, "gradient_accumulation_steps": args.gas,
              "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8}},
              "steps_per_print": 1000}
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    inputs = Inputs(args, rank)
    where = {"step": 0, "micro": 0}
    if args.grad_noise:
        add_grad_noise(net, args.grad_noise, where, seed=rank)
    losses, near_zero = [], None
    for step in range(args.steps):
        order = list(range(args.gas)) if args.order == "forward" else list(reversed(range(args.gas)))
        step_losses = {}
        for micro in order:
            images, labels = inputs.batch(step, micro)
            where.update(step=step, micro=micro)
            if args.dropout > 0:
                torch.manual_seed(1138 * 1000 + step * args.gas + micro)   # each image's masks, whatever the order
            images, labels = images.to(engine.device), labels.to(engine.device)
            loss = torch.nn.functional.cross_entropy(engine(images), labels)
            engine.backward(loss)
            if micro == order[-1] and step == 0:
                near_zero = count_near_zero(net)
            engine.step()
            step_losses[micro] = loss.item()
        if step == 0 and args.save_weights and rank == 0:
            torch.save(torch.cat([p.detach().reshape(-1).cpu() for p in net.parameters()]), args.save_weights)
        losses.append([step_losses[m] for m in range(args.gas)])   # in micro-batch order, whatever the feed
    return {"losses": losses, "near_zero_grads": near_zero}


def main() -> None:
    args = parse_args()
    import deepspeed
    deepspeed.init_distributed(dist_backend=args.backend)
    if args.cudnn_strict:   # on a GPU: no TF32 convolutions, deterministic cuDNN algorithms
        torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = False, True
    if args.no_mkldnn:
        torch.backends.mkldnn.enabled = False
    mine = train(args)
    ranks = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(ranks, mine["losses"])
    if torch.distributed.get_rank() == 0:
        engine = "ours" if "launcher" in deepspeed.__file__ else f"deepspeed {deepspeed.__version__}"
        with open(args.report, "w") as f:
            size = np.load(args.inputs, mmap_mode="r").shape[-1] if args.inputs else args.size
            json.dump({"engine": engine, "order": args.order, "world": len(ranks), "size": size,
                       "inputs": os.path.basename(args.inputs or "randn"), "dropout": args.dropout,
                       "grad_noise": args.grad_noise, "device": "cuda" if torch.cuda.is_available() else "cpu",
                       "cudnn_strict": args.cudnn_strict, "conv_tf32": args.conv_tf32,
                       "no_mkldnn": args.no_mkldnn,
                       "ranks": ranks, "near_zero_grads": mine["near_zero_grads"]}, f, indent=1)
    torch.distributed.destroy_process_group()


def to_tf32(x: torch.Tensor, mode: str) -> torch.Tensor:
    """x with its mantissa cut to TF32's 10 bits (to nearest, ties up, or toward zero); gradients pass straight."""
    bits = x.detach().view(torch.int32)
    if mode == "round":
        bits = bits + 0x1000
    cut = (bits & ~0x1FFF).view(torch.float32)
    return x + (cut - x).detach()


def as_tf32_convolutions(net: torch.nn.Module, mode: str) -> None:
    """Every Conv2d computes on TF32-cut input and weight (its saved tensors for the backward too)."""
    for module in net.modules():
        if isinstance(module, torch.nn.Conv2d):
            def forward(x: torch.Tensor, conv: torch.nn.Conv2d = module) -> torch.Tensor:
                return conv._conv_forward(to_tf32(x, mode), to_tf32(conv.weight, mode), conv.bias)
            module.forward = forward


def add_grad_noise(net: torch.nn.Module, eps: float, where: dict, seed: int) -> None:
    """A tensor hook on every parameter: its micro-batch gradient times 1 + eps x N(0, 1), the noise
    drawn from its own generator (never the global RNG) and fixed by (rank, step, micro-batch, parameter)."""
    for index, param in enumerate(net.parameters()):
        def hook(grad: torch.Tensor, index: int = index) -> torch.Tensor:
            key = ((seed * 1000 + where["step"]) * 1000 + where["micro"]) * 1000 + index
            noise = torch.randn(grad.shape, generator=torch.Generator().manual_seed(key), dtype=grad.dtype)
            return grad * (1 + eps * noise)
        param.register_hook(hook)


def count_near_zero(net: torch.nn.Module) -> dict | None:
    """Weights whose accumulated gradient (before the step) is tiny next to the largest: where Adam's
    first step is a full lr in a direction the rounding picks. None where the engine keeps no .grad."""
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    if not grads:
        return None
    flat = torch.cat([g.reshape(-1).abs() for g in grads])
    return {"weights": flat.numel(), "below_1e-6_of_max": int((flat < 1e-6 * flat.max()).sum()),
            "exactly_zero": int((flat == 0).sum())}


def gap(first: dict, second: dict) -> tuple[float, float]:
    """(rank 0's first loss of step 2, the figure train.py prints; the largest over every loss after
    step 1), both as relative gaps. Step 1's losses come before any update, so they are left out."""
    printed = abs(first["ranks"][0][1][0] - second["ranks"][0][1][0]) / abs(second["ranks"][0][1][0])
    worst = max(abs(x - y) / abs(y) for a, b in zip(first["ranks"], second["ranks"])
                for sa, sb in zip(a[1:], b[1:]) for x, y in zip(sa, sb))
    return printed, worst


def compare(ds_forward: str, ds_reverse: str, ours_forward: str, ours_reverse: str) -> None:
    """The three gaps of issue 41 item 5 (and ours reversed against DeepSpeed reversed)."""
    runs = {name: json.load(open(path)) for name, path in
            zip(("ds", "ds_rev", "ours", "ours_rev"), (ds_forward, ds_reverse, ours_forward, ours_reverse))}
    head = runs["ds"]
    print(f"inputs {head['inputs']}, size {head['size']}, dropout {head['dropout']}, {head['world']} ranks, "
          f"{len(head['ranks'][0])} steps; near-zero gradients at step 1 (DeepSpeed): {head['near_zero_grads']}")
    for name, run in runs.items():
        print(f"  {name:9s} step-2 loss (rank 0, first micro-batch): {run['ranks'][0][1][0]:.5f}")
    for label, a, b in (("(a) ours vs DeepSpeed", "ours", "ds"), ("(b) DeepSpeed reversed vs DeepSpeed", "ds_rev", "ds"),
                        ("(c) ours reversed vs ours", "ours_rev", "ours"),
                        ("(d) ours reversed vs DeepSpeed reversed", "ours_rev", "ds_rev")):
        printed, worst = gap(runs[a], runs[b])
        print(f"  {label:40s} step-2 printed loss {printed:.1e}, largest over steps 2+ {worst:.1e}")


def one_gap(first: str, second: str) -> None:
    """The gap between any two reports (for instance a --grad-noise run and its plain twin)."""
    a, b = (json.load(open(path)) for path in (first, second))
    printed, worst = gap(a, b)
    def name(run: dict) -> str:
        return (f"{run['engine']} {run['order']} noise {run.get('grad_noise', 0)} conv-tf32 "
                f"{run.get('conv_tf32', 'off')} no-mkldnn {run.get('no_mkldnn', False)}")
    print(f"{name(a)} vs {name(b)}: step-2 printed loss {printed:.1e}, largest over steps 2+ {worst:.1e}")


def flips(first: str, second: str) -> None:
    """Two --save-weights files against each other and against the initial weights (seed 1138)."""
    from alexnet_data_path import alexnet_shaped
    torch.manual_seed(1138)
    start = torch.cat([p.detach().reshape(-1) for p in alexnet_shaped().parameters()])
    a, b = torch.load(first), torch.load(second)
    gap = (a - b).abs()
    turned = int(((a - start) * (b - start) < 0).sum())
    print(f"{first} vs {second}: {int((gap > 0).sum())} of {gap.numel()} weights differ, by at most "
          f"{gap.max():.2e} (lr 1e-3); {turned} step-1 updates in opposite directions")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--compare":
        compare(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "--gap":
        one_gap(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "--flips":
        flips(*sys.argv[2:])
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        main()

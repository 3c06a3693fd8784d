#!/usr/bin/env python3
"""Issue 41 item 5 with the example's data path: ``training_data=`` -> DeepSpeed's loader -> RepeatingLoader.

``scripts/adam_sum_order.py`` fed fixed images by hand and found ours and DeepSpeed 0.19.8 within
6e-7 (dropout 0.5 included). DeepSpeedExamples' ``training/pipeline_parallelism/train.py -p 0``
instead hands its dataset to ``deepspeed.initialize(training_data=...)``, wraps the returned loader in
``deepspeed.utils.RepeatingLoader`` and draws every micro-batch from it. That loader matters beyond
its batches: each time torch's DataLoader starts an iterator it draws a base seed from the global
torch RNG, the stream AlexNet's dropout draws from too, and a dataset's random transforms draw either
in the rank (``num_workers=0``) or in worker processes seeded from that base seed.

This script is ``train_base()`` on synthetic data: the example's seed (1138), its ds_config.json
(train_batch_size 256, 8 a micro-batch, "Adam" lr 1e-3), an AlexNet-shaped CNN with dropout 0.5, and
a deterministic in-memory dataset small enough that the run crosses a pass (the loader restarts).
``--flip`` adds a random horizontal flip (torch's RNG, as torchvision's RandomHorizontalFlip) to
the dataset's transform; the example's CIFAR transform has none. Every rank records, per micro-batch,
its loss, the sum of its labels and a fingerprint of the torch RNG state before the forward.

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 scripts/alexnet_data_path.py --report ds.json
    dslaunch --as-deepspeed --num_gpus 2 --no_local_rank scripts/alexnet_data_path.py --report ours.json
    python scripts/alexnet_data_path.py --compare ds.json ours.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

CONFIG = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 8,
          "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8}},
          "steps_per_print": 10, "wall_clock_breakdown": False}


def alexnet_shaped(classes: int = 10, dropout: float = 0.5) -> torch.nn.Module:
    """torchvision's AlexNet layer for layer (5 convolutions, 3 linear layers, dropout before the first two)."""
    relu = lambda: torch.nn.ReLU(inplace=True)   # noqa: E731
    features = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 11, stride=4, padding=2), relu(), torch.nn.MaxPool2d(3, 2),
        torch.nn.Conv2d(64, 192, 5, padding=2), relu(), torch.nn.MaxPool2d(3, 2),
        torch.nn.Conv2d(192, 384, 3, padding=1), relu(), torch.nn.Conv2d(384, 256, 3, padding=1), relu(),
        torch.nn.Conv2d(256, 256, 3, padding=1), relu(), torch.nn.MaxPool2d(3, 2))
    classifier = torch.nn.Sequential(
        torch.nn.Dropout(dropout), torch.nn.Linear(256 * 6 * 6, 4096), relu(), torch.nn.Dropout(dropout),
        torch.nn.Linear(4096, 4096), relu(), torch.nn.Linear(4096, classes))
    return torch.nn.Sequential(features, torch.nn.AdaptiveAvgPool2d((6, 6)), torch.nn.Flatten(1), classifier)


class SyntheticImages(torch.utils.data.Dataset):
    """`count` fixed images (made from their index alone) and labels, normalized on the way out like
    the example's transform; ``flip`` adds a random horizontal flip drawn from torch's global RNG."""

    def __init__(self, count: int, size: int, flip: bool = False):
        gen = torch.Generator().manual_seed(2024)
        self.images = torch.rand(count, 3, size, size, generator=gen)
        self.labels = torch.randint(0, 10, (count,), generator=gen)
        self.flip = flip

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = (self.images[index] - 0.45) / 0.225
        if self.flip and torch.rand(1).item() < 0.5:
            image = image.flip(-1)
        return image, int(self.labels[index])


def rng_fingerprint() -> int:
    """A short number that changes with any draw from the global torch RNG."""
    state = torch.get_rng_state()
    return int((state.to(torch.int64) * torch.arange(1, len(state) + 1)).sum()) % 1_000_003


def parse_args() -> argparse.Namespace:
    import deepspeed
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--steps", type=int, default=2, help="optimizer steps (16 micro-batches each on 2 ranks)")
    p.add_argument("--images", type=int, default=400, help="dataset size (400: a pass is 25 micro-batches a rank)")
    p.add_argument("--size", type=int, default=64, help="image side (train.py: 224)")
    p.add_argument("--flip", action="store_true", help="a random horizontal flip in the dataset's transform")
    p.add_argument("--seed", type=int, default=1138)
    p.add_argument("--report", required=True)
    p = deepspeed.add_config_arguments(p)
    return p.parse_args()


def train(args: argparse.Namespace) -> list[dict]:
    """train.py's train_base(), every micro-batch recorded."""
    import deepspeed
    from deepspeed.utils import RepeatingLoader
    torch.manual_seed(args.seed)
    net = alexnet_shaped()
    trainset = SyntheticImages(args.images, args.size, args.flip)
    engine, _, dataloader, _ = deepspeed.initialize(
        args=args, model=net, model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=trainset, config=CONFIG)
    data_iter = iter(RepeatingLoader(dataloader))
    criterion = torch.nn.CrossEntropyLoss()
    records = []
    for _ in range(args.steps * engine.gradient_accumulation_steps()):
        batch = next(data_iter)
        inputs, labels = batch[0].to(engine.device), batch[1].to(engine.device)
        before = rng_fingerprint()
        loss = criterion(engine(inputs), labels)
        engine.backward(loss)
        engine.step()
        records.append({"loss": loss.item(), "labels": int(labels.sum()), "rows": len(labels), "rng": before})
    return records


def main() -> None:
    args = parse_args()
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    records = train(args)
    ranks = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(ranks, records)
    if torch.distributed.get_rank() == 0:
        engine = "ours" if "launcher" in deepspeed.__file__ else f"deepspeed {deepspeed.__version__}"
        with open(args.report, "w") as f:
            json.dump({"engine": engine, "size": args.size, "images": args.images, "flip": args.flip,
                       "ranks": ranks}, f)


def compare(first: str, second: str) -> None:
    """The first micro-batch where the two runs part, and the largest relative loss gap."""
    a, b = (json.load(open(path)) for path in (first, second))
    print(f"{a['engine']} vs {b['engine']}: size {a['size']}, images {a['images']}, flip {a['flip']}")
    worst = 0.0
    for rank, (mine, theirs) in enumerate(zip(a["ranks"], b["ranks"])):
        for micro, (x, y) in enumerate(zip(mine, theirs)):
            gap = abs(x["loss"] - y["loss"]) / abs(y["loss"])
            worst = max(worst, gap)
            same = x["labels"] == y["labels"] and x["rng"] == y["rng"]
            if gap > 1e-6 or not same:
                print(f"  rank {rank} micro {micro}: loss {x['loss']:.7f} vs {y['loss']:.7f} ({gap:.1e}), "
                      f"labels {x['labels']} vs {y['labels']}, rng {x['rng']} vs {y['rng']}")
    print(f"  largest relative loss gap over {sum(map(len, a['ranks']))} micro-batch losses: {worst:.1e}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        main()

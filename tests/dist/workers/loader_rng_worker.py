"""``training_data=``'s loader and the global torch RNG: random transforms and dropout as DeepSpeed's loader leaves them.

DeepSpeed 0.19.8's engine loader reads batches in 2 worker processes per rank, seeded from a base
seed the DataLoader draws from the global RNG when its iterator starts, at ``iter(loader)`` (its
``(x for x in loader)`` evaluates ``iter`` at once), not at the first batch. A dataset whose transform draws from torch's RNG and a
model with dropout see the same random numbers only where both are matched. This trains a small
dropout MLP, fp32 Adam, over a dataset with a random flip and random noise, for several passes of
``RepeatingLoader(loader)``, with a draw between ``iter()`` and the first batch; ``--report`` gets
every micro-batch's loss on each rank.
"""
from __future__ import annotations

import argparse
import json

import torch

import deepspeed
from deepspeed.utils import RepeatingLoader

CONFIG = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "steps_per_print": 1000}


class NoisyImages(torch.utils.data.Dataset):
    """40 fixed 3 x 8 x 8 images; each read flips one at random and adds random noise (torch's RNG)."""

    def __init__(self):
        gen = torch.Generator().manual_seed(5)
        self.images, self.labels = torch.rand(40, 3, 8, 8, generator=gen), torch.randint(0, 10, (40,), generator=gen)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        image = self.images[index]
        if torch.rand(1).item() < 0.5:
            image = image.flip(-1)
        return image + 0.1 * torch.randn_like(image), int(self.labels[index])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--report", required=True)
    args = p.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(1138)
    net = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(192, 64), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                              torch.nn.Linear(64, 10))
    engine, _, loader, _ = deepspeed.initialize(args=args, model=net, model_parameters=net.parameters(),
                                                training_data=NoisyImages(), config=CONFIG)
    data_iter = iter(RepeatingLoader(loader))
    torch.rand(1)  # a draw after iter(): DeepSpeed's loader has drawn its workers' seed already
    losses = []
    for _ in range(args.steps * engine.gradient_accumulation_steps()):  # 20 samples a rank: 5 micro-batches a pass
        inputs, labels = next(data_iter)
        loss = torch.nn.functional.cross_entropy(engine(inputs), labels)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    ranks = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(ranks, losses)
    if torch.distributed.get_rank() == 0:
        with open(args.report, "w") as f:
            json.dump({"steps": [{"step": i, "loss": loss} for i, loss in enumerate(ranks[0])], "ranks": ranks}, f)


if __name__ == "__main__":
    main()

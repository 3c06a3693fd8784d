"""Trains a few steps; the ranks in argv[1] ("1" or "2,3") sleep forever inside the forward of step 3
while the others go on into that step's gradient all-reduce and wait there (for tests of --stall_timeout)."""
import sys
import time

import torch

from launcher import zero

STUCK_RANKS = {int(rank) for rank in sys.argv[1].split(",")}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        if self.steps == 3 and torch.distributed.get_rank() in STUCK_RANKS:
            print("stuck rank: going to sleep", flush=True)
            sleep_inside_the_step()
        return self.layer(x)


def sleep_inside_the_step():
    while True:
        time.sleep(1)


engine, _, _, _ = zero.initialize(model=Model(), config={
    "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 2}})
for step in range(5):
    loss = engine(torch.ones(2, 4)).pow(2).mean()
    engine.backward(loss)
    engine.step()
print("finished", flush=True)

"""A rank that builds a one-layer model and hands `zero.initialize` the config named by argv[1]."""
import sys
import time

import torch

from launcher import zero

model = torch.nn.Linear(4, 4)
engine, _, _, _ = zero.initialize(model=model, config=sys.argv[1])
print("initialized", flush=True)
if sys.argv[2:] == ["sleep"]:   # wait to be interrupted
    while True:
        time.sleep(0.1)

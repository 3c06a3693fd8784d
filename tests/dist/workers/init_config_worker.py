"""A rank that builds its model under ``zero.Init(config_dict_or_path=argv[1])`` and then initializes."""
import sys

import torch

from launcher import zero

with zero.Init(config_dict_or_path=sys.argv[1]):
    model = torch.nn.Linear(4, 4)
engine, _, _, _ = zero.initialize(model=model, config=sys.argv[1])
print("initialized", flush=True)

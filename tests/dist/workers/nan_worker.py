"""Train the tiny GPT and plant an inf in one layer's output (argv: config, layer, step or first:last, steps, rank).

``rank`` is the rank whose layer gets the inf (-1: every rank). The plant is a forward hook that
multiplies the layer's output by inf while ``poisoned`` is set; the script sets it for the chosen
steps only, so a re-run of that step's micro-batch inside engine.step() sees it again.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from launcher import zero  # noqa: E402
from tests.helpers.gpt import GPT, TINY  # noqa: E402

config_path, layer, steps, bad_rank = sys.argv[1], sys.argv[2], int(sys.argv[4]), int(sys.argv[5])
first, _, last = sys.argv[3].partition(":")
bad_steps = range(int(first), int(last or first) + 1)
torch.manual_seed(0)
model = GPT(TINY)
poisoned = {"on": False}
target = model.get_submodule(layer)
target.register_forward_hook(lambda _m, _i, out: out * float("inf") if poisoned["on"] else None)
with open(config_path) as handle:
    config = json.load(handle)
engine, *_ = zero.initialize(model=model, config=config)
rank = engine.dist_context.rank
generator = torch.Generator().manual_seed(1 + rank)
for step in range(1, steps + 1):
    idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len), generator=generator)
    poisoned["on"] = step in bad_steps and bad_rank in (-1, rank)
    loss = engine(idx, idx)
    engine.backward(loss)
    engine.step()
    poisoned["on"] = False
print(f"RESULT {json.dumps({'rank': rank, 'skipped': engine.skipped_steps, 'steps': engine.global_steps})}", flush=True)

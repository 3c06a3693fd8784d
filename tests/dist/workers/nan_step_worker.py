"""A tutorial-style script whose inf depends on the step: a forward hook on one layer turns its
output to inf while ``engine.global_steps`` equals a number (argv: config, layer, global_steps
value, steps, rank or -1 for every rank, micro-batch of the step or -1 for every one, and
"forward" or "backward": the inf in the layer's output, or in the gradient its backward passes on).

Nothing re-creates the inf after the step's forward: a re-run of the micro-batch stays finite,
so only a diagnosis made during the step can name the layer.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

from launcher import zero  # noqa: E402
from tests.helpers.gpt import GPT, TINY  # noqa: E402

config_path, layer, bad_step, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
bad_rank, bad_micro, phase = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]


class InfGradient(torch.autograd.Function):
    """Identity forward; the backward passes on an inf gradient."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


torch.manual_seed(0)
model = GPT(TINY)
with open(config_path) as handle:
    config = json.load(handle)
engine, *_ = zero.initialize(model=model, config=config)
rank = engine.dist_context.rank
micro = {"n": 0}


def plant(_module, _inputs, output):
    hit = engine.global_steps == bad_step and bad_rank in (-1, rank) and bad_micro in (-1, micro["n"])
    if not hit:
        return None
    return output * float("inf") if phase == "forward" else InfGradient.apply(output)


model.get_submodule(layer).register_forward_hook(plant)
generator = torch.Generator().manual_seed(1 + rank)
for _ in range(steps * engine.gradient_accumulation_steps()):
    idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len), generator=generator)
    loss = engine(idx, idx)
    engine.backward(loss)
    micro["n"] = (micro["n"] + 1) % engine.gradient_accumulation_steps()
    engine.step()
print(f"RESULT {json.dumps({'rank': rank, 'skipped': engine.skipped_steps, 'steps': engine.global_steps})}", flush=True)

"""Rank-side checks written the way DeepSpeed's tutorials write scripts (issue 17).

Scenarios (first argument), each printing ``RESULT {json}`` lines:
  seeds     every rank seeds its model differently; stages 0-3 must still train rank 0's model
  plain     ``loss.backward()`` instead of ``engine.backward(loss)`` at stages 1-3 and offload;
            stage 0 must refuse it
  access    stage 3 on modules that read a child's weight without calling the child
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

from launcher import zero
from tests.helpers.tiny import MBS, data, groups, make_model, reference

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
STEPS = 4


def config(stage, gas=1, offload=False, clip=0.0, threshold=None, fp16=False):
    zero_section = {"stage": stage, "reduce_bucket_size": 16}
    if offload:
        zero_section["offload_optimizer"] = {"device": "cpu"}
    if threshold is not None:
        zero_section["stage3_param_persistence_threshold"] = threshold
    cfg = {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": gas, "gradient_clipping": clip,
           "zero_optimization": zero_section,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "betas": [0.9, 0.99], "eps": 1e-8}}}
    if fp16:
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "auto_cast": True}
    return cfg


def full_params(engine, model):
    """Every parameter whole, on the CPU (gathered at stage 3)."""
    with zero.GatheredParameters(list(model.parameters())):
        return [p.detach().float().cpu().clone() for p in model.parameters()]


def train(engine, gas, plain):
    x, y = data(WORLD, gas, STEPS)
    for step in range(STEPS):
        for micro in range(gas):
            start = ((step * gas + micro) * WORLD + RANK) * MBS
            xs, ys = x[start:start + MBS].to(engine.device), y[start:start + MBS].to(engine.device)
            loss = F.mse_loss(engine(xs).float(), ys)
            if plain:
                loss.backward()
            else:
                engine.backward(loss)
            engine.step()


def error_vs_reference(params, gas, clip):
    ref = reference(WORLD, gas, clip, STEPS)
    return max((a - b).abs().max().item() for a, b in zip(params, ref.parameters()))


def seeds():
    for stage in (0, 1, 2, 3):
        model = make_model(seed=RANK)            # rank 0's seed is the reference's seed
        engine, *_ = zero.initialize(model=model, model_parameters=groups(model), config=config(stage, gas=2))
        train(engine, gas=2, plain=False)
        emit(scenario="seeds", stage=stage, error=error_vs_reference(full_params(engine, model), 2, 0.0))


def plain():
    cases = [(1, 1, False, 0.0), (1, 3, False, 0.05), (2, 1, False, 0.0), (2, 3, False, 0.05), (2, 2, True, 1.0),
             (1, 2, True, 0.0), (3, 1, False, 0.0), (3, 3, False, 0.05), (3, 2, True, 0.0)]
    for stage, gas, offload, clip in cases:
        model = make_model()
        engine, *_ = zero.initialize(model=model, model_parameters=groups(model),
                                     config=config(stage, gas, offload, clip, threshold=0))
        train(engine, gas, plain=True)
        emit(scenario="plain", stage=stage, gas=gas, offload=offload, clip=clip,
             error=error_vs_reference(full_params(engine, model), gas, clip))
    finals = []
    for plain_backward in (False, True):   # fp16: the loss scale must reach a plain backward too
        model = make_model()
        engine, *_ = zero.initialize(model=model, model_parameters=groups(model), config=config(2, 2, fp16=True))
        train(engine, 2, plain=plain_backward)
        finals.append((full_params(engine, model), engine.get_loss_scale()))
    emit(scenario="plain_fp16", error=max((a - b).abs().max().item() for a, b in zip(finals[0][0], finals[1][0])),
         scales=[finals[0][1], finals[1][1]])
    model = make_model()
    engine, *_ = zero.initialize(model=model, config=config(0))
    loss = engine(torch.randn(MBS, 7)).sum()
    try:
        loss.backward()
        emit(scenario="stage0", refused=False, message="")
    except Exception as error:  # noqa: BLE001 - the test checks the type by name
        emit(scenario="stage0", refused=True, kind=type(error).__name__, message=str(error),
             hint=getattr(error, "hint", None))


class ReadsChildWeight(torch.nn.Module):
    """Calls ``lin`` once, then multiplies by ``lin.weight`` again after lin has been released."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.gain = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        return self.lin(x) * self.gain @ self.lin.weight.t()


class Tied(torch.nn.Module):
    """An embedding and a head sharing one weight (one Parameter owned by two modules)."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(11, 8)
        self.mix = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.emb(tokens))))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.attn(x, x, x, need_weights=False)[0])


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.layer(x))


MODELS = {"mha": Attention, "encoder": Encoder, "child_weight": ReadsChildWeight, "tied": Tied}


def batches(name, steps):
    gen = torch.Generator().manual_seed(5 + RANK)
    for _ in range(steps):
        if name == "tied":
            tokens = torch.randint(0, 11, (MBS, 5), generator=gen)
            yield tokens, torch.randint(0, 11, (MBS, 5), generator=gen)
        elif name == "child_weight":
            yield torch.randn(MBS, 8, generator=gen), torch.randn(MBS, 8, generator=gen)
        else:
            yield torch.randn(MBS, 5, 8, generator=gen), torch.randn(MBS, 5, 3, generator=gen)


def loss_of(name, out, target):
    if name == "tied":
        return F.cross_entropy(out.reshape(-1, 11), target.reshape(-1))
    return F.mse_loss(out, target)


def access():
    for name, cls in MODELS.items():
        runs = {}
        for stage in (0, 3):
            torch.manual_seed(3)
            model = cls()
            engine, *_ = zero.initialize(model=model, config=config(stage, threshold=0))
            losses = []
            for inputs, target in batches(name, STEPS):
                loss = loss_of(name, engine(inputs.to(engine.device)), target.to(engine.device))
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
            runs[stage] = (losses, full_params(engine, model))
        (l0, p0), (l3, p3) = runs[0], runs[3]
        emit(scenario="access", model=name, losses=l3, loss_error=max(abs(a - b) for a, b in zip(l0, l3)),
             param_error=max((a - b).abs().max().item() for a, b in zip(p0, p3)),
             change=max((a - b).abs().max().item() for a, b in zip(p0, full_params(None, cls_fresh(cls)))))


def cls_fresh(cls):
    torch.manual_seed(3)
    return cls()


def emit(**record):
    if RANK == 0:
        print("RESULT " + json.dumps(record), flush=True)


if __name__ == "__main__":
    {"seeds": seeds, "plain": plain, "access": access}[sys.argv[1]]()

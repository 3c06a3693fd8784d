"""The 7-64-64-3 MLP of the stage-3 runs, shared by the stage-3, offload, zero.Init and stage-3
checkpoint tests: model, config, the training loop, gathering, and the error against the reference."""
from tests.helpers import tiny
from tests.helpers.tiny import MBS, data, groups  # noqa: F401 - part of this module's surface

STEPS = 4
LR = 0.02


def make_model(seed=0, hidden=64):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                               torch.nn.Tanh(), torch.nn.Linear(hidden, 3))


def reference(world_size, gas, clip, steps):
    return tiny.reference(world_size, gas, clip, steps, make=make_model, lr=LR)


def config(gas=1, clip=0.0, bucket=500_000_000, threshold=100, stage=3, **zero):
    return {"train_micro_batch_size_per_gpu": MBS, "gradient_accumulation_steps": gas, "gradient_clipping": clip,
            "zero_optimization": {"stage": stage, "reduce_bucket_size": bucket, "overlap_comm": bucket % 2 == 0,
                                  "stage3_param_persistence_threshold": threshold, **zero},
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.99], "eps": 1e-8}}}


def train(engine, rank, world_size, gas, steps=STEPS):
    import torch
    x, y = data(world_size, gas, steps)
    for step in range(steps):
        for micro in range(gas):
            start = ((step * gas + micro) * world_size + rank) * MBS
            loss = torch.nn.functional.mse_loss(engine(x[start:start + MBS]), y[start:start + MBS])
            engine.backward(loss)
            engine.step()


def full_params(engine):
    """Every parameter gathered (collective), as plain tensors in named order."""
    from launcher import zero
    out = {}
    for name, p in engine.module.named_parameters():
        with zero.GatheredParameters([p]):
            out[name] = p.detach().clone()
    return out


def max_error(engine, ref):
    full = full_params(engine)
    return max((full[n] - p).abs().max().item() for n, p in ref.named_parameters())


def losses(engine, rank, world_size, first, last, steps, gas=2):
    """Steps ``first...last-1`` of a ``steps``-step run (micro-batches cast to the model's dtype, the
    loss in fp32): every micro-step's loss, as the NVMe offload tests compare them."""
    import torch
    dtype = next(engine.module.parameters()).dtype
    x, y = data(world_size, gas, steps)
    out = []
    for step in range(first, last):
        for micro in range(gas):
            start = ((step * gas + micro) * world_size + rank) * MBS
            loss = torch.nn.functional.mse_loss(engine(x[start:start + MBS].to(dtype)).float(), y[start:start + MBS])
            engine.backward(loss)
            engine.step()
            out.append(loss.item())
    return out


def raised(kind, call, *args, **kwargs):
    """``'<Type>: <message> | hint: <hint>'`` for the ``kind`` of error ``call(...)`` raises, None if none."""
    try:
        call(*args, **kwargs)
    except kind as exc:
        return f"{type(exc).__name__}: {exc} | hint: {exc.hint}"
    return None


def nvme_error(call, *args):
    """:func:`raised` for an NvmeOffloadError."""
    from launcher.zero.errors import NvmeOffloadError
    return raised(NvmeOffloadError, call, *args)

"""The 7-5-3 MLP of the stage 0-2 parity runs: model, param groups, data, and the reference.

The reference is single-process AdamW on the global batch: what every ZeRO stage must reproduce.
"""
import torch

STEPS = 4
MBS = 2


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def groups(model):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def data(world_size, gas, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    total = steps * gas * world_size * MBS
    return torch.randn(total, 7, generator=gen), torch.randn(total, 3, generator=gen)


def reference(world_size, gas, clip, steps, make=make_model, lr=0.05):
    """Single-process AdamW on the global batch: what every ZeRO stage must reproduce."""
    model = make()
    opt = torch.optim.AdamW(groups(model), lr=lr, betas=(0.9, 0.99), eps=1e-8)
    x, y = data(world_size, gas, steps)
    per_step = gas * world_size * MBS
    for step in range(steps):
        xs, ys = x[step * per_step:(step + 1) * per_step], y[step * per_step:(step + 1) * per_step]
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return model


def bf16_square_loss_steps(engine, steps, features=16, batch=8, seed=1):
    """``steps`` engine steps on seeded bf16 inputs with the mean square of the output as the loss;
    the gradient norm of each step (the loop the offload and sync-free step tests share)."""
    gen = torch.Generator().manual_seed(seed)
    norms = []
    for _ in range(steps):
        x = torch.randn(batch, features, generator=gen).to(torch.bfloat16)
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()
        norms.append(engine.get_global_grad_norm())
    return norms

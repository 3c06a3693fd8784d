"""Where a step's gradient factor (unscaling and clipping, stages/base.py ``unscale_and_clip_factor``) is applied.

The factor multiplies every master grad before the optimizer steps. torch's fused Adam and AdamW
can divide the gradients by a ``grad_scale`` tensor as their kernel reads them (the way
``torch.amp.GradScaler`` hands them the loss scale): handing them ``1 / factor`` saves the
separate pass over the master grads (read and write, 8 bytes an element: ~3.5 ms of an H100 step
on a 1.24B model). The kernel then writes the divided gradients back (4 bytes an element), so
master grads read after the step hold what the separate pass leaves, to a rounding. Every other
optimizer (ours on the host for offload, which takes the factor itself; Lamb; 1-bit Adam; torch's
unfused ones; a subclass with its own ``step``) gets the separate pass.
"""
from __future__ import annotations

import contextlib

import torch

def fuses_grad_factor(optimizer: torch.optim.Optimizer, masters_on_device: bool) -> bool:
    """Whether the step hands its gradient factor to the optimizer's kernel: torch's own fused
    Adam/AdamW (exactly those classes: a subclass's ``step`` might not read ``grad_scale``) over
    masters on the device (offloaded masters step in our CPU Adam, which takes the factor its own
    way)."""
    return (masters_on_device and type(optimizer) in (torch.optim.Adam, torch.optim.AdamW)
            and bool(optimizer.defaults.get("fused")))


def grad_scale_of(factor: float | torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """What the gradients are divided by to multiply them by ``factor``: ``1 / factor`` as a
    float32 tensor on ``device`` (a tensor factor stays on its device: no host sync); a zero
    factor (an infinite norm that does not skip) gives inf, as the separate pass multiplies by 0.
    None for a factor of exactly 1 (nothing to divide)."""
    if torch.is_tensor(factor):
        return torch.reciprocal(factor).to(torch.float32)
    if factor == 1.0:
        return None
    return torch.full((), 1.0 / factor if factor != 0 else float("inf"), dtype=torch.float32, device=device)


@contextlib.contextmanager
def factor_in_kernel(optimizer: torch.optim.Optimizer, factor: float | torch.Tensor, device: torch.device):
    """While open, ``optimizer.step()`` multiplies the gradients by ``factor`` (a float or a 0-dim
    tensor, on the device: no host sync): ``grad_scale`` is ``grad_scale_of(factor)``, a float32
    tensor as the kernel reads it. A factor of exactly 1 hands nothing (the kernel then does
    not write the gradients back). The attribute is removed on leaving, so a later step of the
    same optimizer by the user is not scaled."""
    scale = grad_scale_of(factor, device)
    if scale is None:
        yield
        return
    optimizer.grad_scale = scale
    try:
        yield
    finally:
        del optimizer.grad_scale

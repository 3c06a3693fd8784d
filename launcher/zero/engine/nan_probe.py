"""Which layer went non-finite, where the step's own trace is off (``non_finite.trace`` false; the
trace, nan_trace.py, sees the step itself): re-run a step's last micro-batch once, with hooks armed
only for that run. An inf that does not repeat (one keyed on the step) is not seen by the re-run.

Training pays nothing for this until a step's gradients (or loss) are inf/NaN: the engine keeps a
reference to the last micro-batch's inputs, and at the job's first non-finite step every rank runs
that micro-batch again through the module with a forward hook on every submodule (the first output
in forward order holding inf/NaN names the layer) and, when the forward stays finite, a backward
with full-backward hooks (the first module in backward order whose input gradient turns non-finite
while its output gradient was finite). The backward asks autograd for the parameters' gradients
directly, so no ``.grad`` and none of the ZeRO stage's gradient hooks are touched.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from launcher.zero.engine.plain_backward import tensors_in


@dataclass(frozen=True)
class Finding:
    """Where one rank's re-run first saw inf/NaN."""

    rank: int
    phase: str                  # "forward" (an output) or "backward" (a gradient)
    module: str                 # dotted name in the model; "" is the model itself
    module_type: str
    parameter: str | None       # the module's parameter holding (or receiving) inf/NaN, when one does
    micro_batch: int | None = None   # found during the step (nan_trace.py): which micro-batch, 0-based
    micro_batches: int = 1      # the step's micro-batches seen by the trace
    after: str | None = None    # traced backward: the module whose output gradient was the first non-finite

    def describe(self) -> str:
        name = self.module or "(the model itself)"
        if self.micro_batch is not None:
            return self._describe_traced(name)
        what = "output" if self.phase == "forward" else "input gradient (its output gradient was finite)"
        text = f"first non-finite {what} in {'forward' if self.phase == 'forward' else 'backward'} order: " \
               f"{name} ({self.module_type}) on rank {self.rank}"
        if self.parameter:
            text += f"; parameter {self.parameter} " + ("holds inf/NaN" if self.phase == "forward"
                                                         else "gets a non-finite gradient")
        return text

    def _describe_traced(self, name: str) -> str:
        where = f"{name} ({self.module_type}) on rank {self.rank}, micro-batch {self.micro_batch + 1} " \
                f"of {self.micro_batches} of the step"
        if self.phase == "forward":
            return f"first non-finite output in forward order: {where}"
        if self.after is None:
            return f"first non-finite gradient in backward order: the output gradient of {where}"
        return f"first non-finite gradient in backward order: in the backward of {where} (its output " \
               f"gradient was finite, the next checked, of {self.after or '(the model itself)'}'s output, was not)"


def _non_finite(value) -> bool:
    return any(t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()) for t in tensors_in(value))


def _own_parameters(module: torch.nn.Module, prefix: str):
    for name, param in module.named_parameters(recurse=False):
        yield (f"{prefix}.{name}" if prefix else name), param


def probe(module: torch.nn.Module, inputs: tuple, rank: int, loss_factor: float = 1.0,
          backward: bool = True) -> Finding | None:
    """Run ``module(*args, **kwargs)`` (``inputs = (args, kwargs)``) once more with hooks; None: all finite."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")   # token-id inputs need no grad
        return _probe(module, inputs, rank, loss_factor, backward)


def _probe(module, inputs, rank, loss_factor, backward) -> Finding | None:
    args, kwargs = inputs
    names = {m: n for n, m in module.named_modules()}
    found: list[Finding] = []
    handles = []

    def after_forward(sub, _inputs, output):
        if not found and _non_finite(output):
            prefix = names[sub]
            bad = next((n for n, p in _own_parameters(sub, prefix) if _non_finite(p)), None)
            found.append(Finding(rank, "forward", prefix, type(sub).__name__, bad))

    def after_backward(sub, grad_input, grad_output):
        if not found and _non_finite(grad_input) and not _non_finite(grad_output):
            found.append(Finding(rank, "backward", names[sub], type(sub).__name__, None))

    try:
        for sub in names:
            handles.append(sub.register_forward_hook(after_forward))
            if backward:
                handles.append(sub.register_full_backward_hook(after_backward))
        with torch.set_grad_enabled(backward):
            output = module(*args, **kwargs)
        if found or not backward:
            return found[0] if found else None
        loss = _scalar(output)
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if loss is None or not loss.requires_grad or not params:
            return None
        grads = torch.autograd.grad(loss * loss_factor, [p for _, p in params], allow_unused=True)
        if not found:
            return None
        origin = found[0]
        prefix = origin.module + "." if origin.module else ""
        bad = next((n for (n, _), g in zip(params, grads)
                    if g is not None and n.startswith(prefix) and "." not in n[len(prefix):] and _non_finite(g)), None)
        return Finding(rank, origin.phase, origin.module, origin.module_type, bad)
    finally:
        for handle in handles:
            handle.remove()


def _scalar(output) -> torch.Tensor | None:
    """The loss to differentiate: the output if it is one number, else the sum of its float tensors."""
    tensors = [t for t in tensors_in(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        return None
    if len(tensors) == 1 and tensors[0].numel() == 1:
        return tensors[0].reshape(())
    return sum(t.float().sum() for t in tensors)

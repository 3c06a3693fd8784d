"""Plain ``loss.backward()`` on an engine's output, as DeepSpeed allows at stages 1-3.

``engine.backward(loss)`` scales the loss (1 / gradient_accumulation_steps, times the fp16
loss scale) and runs the strategy's ``pre_backward`` / ``post_backward`` around autograd. A
script that calls ``loss.backward()`` itself skips all three, and at stage 2 its gradients would
never reach their owners. So the engine marks every output of its forward with a tensor hook:

- inside ``engine.backward`` the hook does nothing;
- in a plain backward the first hook to fire runs ``pre_backward`` (before any parameter's
  gradient exists, since parameters reach the loss only through the outputs) and queues
  ``post_backward`` to run when autograd finishes; every hook multiplies its output's gradient
  by the same factor ``engine.backward`` would have put on the loss.

Stage 0 refuses plain backward with a clear error, as DeepSpeed does.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from launcher.zero.errors import ConfigError


class PlainBackwardRefused(ConfigError):
    """``loss.backward()`` at a stage that needs ``engine.backward(loss)``."""


class BackwardHooks:
    """Marks forward outputs; runs the strategy's backward prologue and epilogue from autograd."""

    def __init__(self, stage: int, factor: Callable[[], float], prologue: Callable[[], bool],
                 epilogue: Callable[[bool], None]):
        self.stage = stage
        self.factor = factor          # the loss factor of this micro-step (1/GAS x loss scale)
        self.prologue = prologue      # runs strategy.pre_backward; returns the boundary flag
        self.epilogue = epilogue      # runs strategy.post_backward(boundary)
        self.inside_engine_backward = False
        self._running: bool | None = None   # the boundary flag of the plain backward in flight

    def mark(self, output: Any) -> None:
        """Hook every floating tensor in ``output`` (tensors, tuples, lists, dicts) that needs grad."""
        if not torch.is_grad_enabled():
            return
        self._running = None   # a plain backward that raised midway never reached its epilogue
        for tensor in tensors_in(output):
            if tensor.requires_grad and tensor.is_floating_point():
                tensor.register_hook(self._on_output_grad)

    def _on_output_grad(self, grad: torch.Tensor):
        if self.inside_engine_backward:
            return None
        if self.stage == 0:
            raise PlainBackwardRefused(
                "loss.backward() is not supported at ZeRO stage 0 (DeepSpeed refuses it too)",
                hint="call engine.backward(loss), or use zero_optimization.stage 1, 2 or 3")
        if self._running is None:
            self._running = self.prologue()
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        factor = self.factor()
        return grad if factor == 1.0 else grad * factor

    def _finish(self) -> None:
        boundary, self._running = self._running, None
        self.epilogue(bool(boundary))


def tensors_in(value: Any):
    """Every tensor in a (nested) output: lists, tuples, dicts and dataclasses (HF's ModelOutput)."""
    if torch.is_tensor(value):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)
    elif hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            yield from tensors_in(getattr(value, name))

"""Count the FLOPs of a stretch of work, per module, with torch's own ``FlopCounterMode``.

torch counts matrix products (mm, addmm, bmm, convolutions) at 2 FLOPs per multiply-add;
elementwise work (norms, activations, softmax, the optimizer) counts 0, as in the usual
model-FLOPs convention. The fused attention kernels, CPU and CUDA, grouped-query attention
included, are counted by attention_formulas.py's formulas, which replace torch's.

Two promises make it a watcher (STYLE.md: it never fails the step, never changes what runs):

- **A failure is a finding, not an error.** Every formula, and the per-op bookkeeping around it,
  runs guarded: the first exception is kept as ``CountFailure`` (the op and the error), the op
  runs on uncounted, and ``stop()`` returns a count marked failed for the caller to say once.
- **The counted stretch runs eagerly, unseen by dynamo.** ``FlopCounterMode`` is a
  ``TorchDispatchMode``; dynamo does not compile a frame entered under one, and marks that code
  to be skipped for good (torch 2.13 ``convert_frame``: the skip's ``apply_to_code``), so a first
  step counted under the mode left a ``torch.compile``-d model eager for the whole job (issue 39:
  0 graphs on the counting rank). While counting, the compiler's stance is ``force_eager``
  (``torch.compiler.set_stance``, torch >= 2.6): compiled functions run their Python as written
  and dynamo's frame callback is not even installed, so it neither sees the mode nor marks
  anything; the next step compiles as if nothing had been counted. (``torch._dynamo.config.disable``
  would not do: dynamo still sees the frame and marks it skipped.) The counted step is the eager
  one: same math, and the count is exact where an inductor graph would hide fused kernels from
  the mode. Where torch has no ``set_stance``, ``eager_counting_supported()`` is False and the
  engine does not count a compiled model (one message; instruments.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import FlopCounterMode

from launcher.zero.flops.attention_formulas import attention_formulas

GLOBAL = "Global"   # FlopCounterMode's name for "everything counted"


@dataclass(frozen=True)
class CountFailure:
    """Why a count is incomplete: the op being counted (or the counter's own step) and the error."""

    where: str      # "aten.mm", or "start" / "stop" for the counter itself
    error: str      # "AssertionError: ..."

    def describe(self) -> str:
        return f"counting FLOPs failed at {self.where}: {self.error}"


@dataclass
class FlopCount:
    """FLOPs counted between ``start()`` and ``stop()``: the total, the forward part, and per module.
    ``failure`` set: the count is incomplete and must not be shown (no MFU, no profile)."""

    forward: int = 0
    total: int = 0
    per_module: dict[str, int] = field(default_factory=dict)   # dotted name in the root ("" = the root)
    failure: CountFailure | None = None


def eager_counting_supported() -> bool:
    """Whether this torch can run a counted stretch eagerly past ``torch.compile`` (set_stance, 2.6+)."""
    return hasattr(torch, "compiler") and hasattr(torch.compiler, "set_stance")


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:500]


class _GuardedMode(FlopCounterMode):
    """FlopCounterMode whose formulas and per-op bookkeeping cannot raise into the model's ops."""

    def __init__(self, formulas: dict, on_failure):
        super().__init__(display=False, depth=None, custom_mapping=formulas)
        self._on_failure = on_failure
        self.flop_registry = {op: self._guard(op, formula) for op, formula in self.flop_registry.items()}

    def _guard(self, op, formula):
        def guarded(*args, **kwargs):
            try:
                return formula(*args, **kwargs)
            except Exception as error:
                self._on_failure(CountFailure(_op_name(op), _describe(error)))
                return 0
        return guarded

    def _count_flops(self, func_packet, out, args, kwargs):   # torch's per-op step (module parents)
        try:
            return super()._count_flops(func_packet, out, args, kwargs)
        except Exception as error:
            self._on_failure(CountFailure(_op_name(func_packet), _describe(error)))
            return out


def _op_name(op) -> str:
    """``aten.mm`` for an op packet (str() names it so), a higher-order op's or a kernel's own name else."""
    return str(op) if isinstance(op, torch._ops.OpOverloadPacket) else getattr(op, "__name__", str(op))


class FlopCounter:
    """Counts while started; ``forward_done()`` marks where a forward pass ended (forward vs backward).

    Never raises: a failure to start leaves it not counting (``failure`` says why); a failure while
    counting or stopping comes back as ``FlopCount.failure``. ``formulas``: more formulas, over
    torch's and the attention ones (a test injects a failing one)."""

    def __init__(self, formulas: dict | None = None):
        self._formulas = formulas
        self._mode: _GuardedMode | None = None
        self._stance = None
        self._forward = 0
        self._forward_from = 0
        self.failure: CountFailure | None = None

    @property
    def counting(self) -> bool:
        return self._mode is not None

    def _failed(self, failure: CountFailure) -> None:
        if self.failure is None:
            self.failure = failure

    def start(self) -> bool:
        """Start counting (eagerly: see the module docstring); False if it could not."""
        self.failure = None
        self._forward, self._forward_from = 0, 0
        formulas = {**attention_formulas(), **(self._formulas or {})}
        try:
            mode = _GuardedMode(formulas, self._failed)
            if eager_counting_supported():
                self._stance = torch.compiler.set_stance("force_eager")   # set now; __exit__ restores
            mode.__enter__()
        except Exception as error:
            self._restore_stance()
            self._failed(CountFailure("start", _describe(error)))
            return False
        self._mode = mode
        return True

    def _restore_stance(self) -> None:
        stance, self._stance = self._stance, None
        if stance is not None:
            stance.__exit__(None, None, None)

    def forward_begins(self) -> None:
        if self._mode is not None:
            self._forward_from = self._mode.get_total_flops()

    def forward_done(self) -> None:
        if self._mode is not None:
            self._forward += self._mode.get_total_flops() - self._forward_from

    def stop(self) -> FlopCount:
        mode, self._mode = self._mode, None
        if mode is None:
            return FlopCount(failure=self.failure)
        try:
            mode.__exit__(None, None, None)
            counted = FlopCount(forward=self._forward, total=mode.get_total_flops(),
                                per_module=per_module(mode.get_flop_counts()))
        except Exception as error:
            self._failed(CountFailure("stop", _describe(error)))
            counted = FlopCount()
        finally:
            self._restore_stance()
        counted.failure = self.failure
        return counted


def per_module(counts: dict[str, dict]) -> dict[str, int]:
    """FlopCounterMode's ``{"GPT.blocks.0.fc": {op: flops}}`` as ``{"blocks.0.fc": flops}``; the root is ""."""
    result: dict[str, int] = {}
    for name, ops in counts.items():
        if name == GLOBAL:
            continue
        inner = name.split(".", 1)[1] if "." in name else ""
        result[inner] = result.get(inner, 0) + sum(ops.values())
    # containers never called (ModuleList, ModuleDict) get the sum of their children
    for name in sorted((n for n in result if n), key=lambda n: -n.count(".")):
        parent = name.rsplit(".", 1)[0] if "." in name else None
        if parent is not None and parent not in counts_names(counts):
            result[parent] = result.get(parent, 0) + result[name]
    if GLOBAL in counts:   # the root's count: everything (its backward is not attributed to it by torch)
        result[""] = sum(counts[GLOBAL].values())
    return result


def counts_names(counts: dict[str, dict]) -> set[str]:
    """The dotted names torch counted, without the root's class name."""
    return {name.split(".", 1)[1] for name in counts if "." in name}


def count_flops(run, formulas: dict | None = None) -> FlopCount:
    """The FLOPs of ``run()`` (a callable doing forward and maybe backward); ``failure`` set if incomplete."""
    counter = FlopCounter(formulas)
    counter.start()
    try:
        run()
    finally:
        counted = counter.stop()
    return counted

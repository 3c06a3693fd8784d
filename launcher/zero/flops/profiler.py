"""DeepSpeed's flops-profiler API (``deepspeed.profiling.flops_profiler``) over our counter.

``get_model_profile(model, input_shape=...)`` runs the model's forward once (after ``warm_up``
runs) and returns its FLOPs, MACs (FLOPs / 2: every counted op is multiply-adds) and parameters;
``FlopsProfiler`` counts whatever runs between ``start_profile()`` and ``stop_profile()``.
"""
from __future__ import annotations

import os
import sys
import time

import torch

from launcher.zero.errors import NotSupportedError
from launcher.zero.flops.counter import FlopCount, FlopCounter
from launcher.zero.flops.report import StepFacts, profile_text, seconds, si


class FlopsProfiler:
    """Counts the FLOPs of ``model``'s work between ``start_profile()`` and ``stop_profile()``."""

    def __init__(self, model: torch.nn.Module, ds_engine=None, recompute_fwd_factor: float = 0.0):
        self.model = model
        self.ds_engine = ds_engine
        self._counter = FlopCounter()
        self._count = FlopCount()
        self._started_at: float | None = None
        self._duration = 0.0
        self.started = False

    def start_profile(self, ignore_list=None) -> None:
        if ignore_list:
            raise NotSupportedError("FlopsProfiler.start_profile(ignore_list=...): leaving modules out of the count "
                                    "is not supported by dslaunch's flops profiler", hint="drop ignore_list")
        if not self._counter.start():
            print(f"[zero] warning: flops profiler: {self._counter.failure.describe()}; no FLOPs reported",
                  file=sys.stderr, flush=True)
        self._started_at = time.perf_counter()
        self.started = True

    def stop_profile(self) -> None:
        if self._counter.counting:
            self._duration = time.perf_counter() - (self._started_at or time.perf_counter())
            self._counter.forward_begins()   # everything counted so far is "forward" for this API
            self._count = self._counter.stop()
            if self._count.failure is not None:   # a partial count would mislead: none, said once
                print(f"[zero] warning: flops profiler: {self._count.failure.describe()}; no FLOPs reported",
                      file=sys.stderr, flush=True)
                self._count = FlopCount()
            self._count.forward = self._count.total

    def reset_profile(self) -> None:
        self._count, self._duration = FlopCount(), 0.0

    def end_profile(self) -> None:
        self.stop_profile()
        self.started = False

    def get_total_flops(self, as_string: bool = False):
        return si(self._count.total) if as_string else self._count.total

    def get_total_macs(self, as_string: bool = False):
        macs = self._count.total // 2
        return si(macs, "MACs") if as_string else macs

    def get_total_duration(self, as_string: bool = False):
        return seconds(self._duration) if as_string else self._duration

    def get_total_params(self, as_string: bool = False):
        params = sum(p.numel() for p in self.model.parameters())
        return si(params) if as_string else params

    def print_model_profile(self, profile_step: int = 1, module_depth: int = -1, top_modules: int = 1,
                            detailed: bool = True, output_file: str | None = None) -> None:
        if not self.started:
            return
        facts = StepFacts(step=profile_step, params=self.get_total_params(), forward_s=self._duration or None)
        types = {name: type(m).__name__ for name, m in self.model.named_modules()}
        write_profile(profile_text(self._count, facts, module_depth, top_modules, detailed, types), output_file)


def write_profile(text: str, output_file: str | None) -> None:
    """To ``output_file`` (its folder created), else stdout."""
    if output_file:
        folder = os.path.dirname(os.path.abspath(output_file))
        os.makedirs(folder, exist_ok=True)
        with open(output_file, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
    else:
        print(text, file=sys.stdout, flush=True)


def get_model_profile(model: torch.nn.Module, input_shape: tuple | None = None, args=(), kwargs=None,
                      print_profile: bool = True, detailed: bool = True, module_depth: int = -1,
                      top_modules: int = 1, warm_up: int = 1, as_string: bool = True, output_file: str | None = None,
                      ignore_modules=None, mode: str = "forward"):
    """``(flops, macs, params)`` of one forward of ``model`` (strings like ``"1.23 G"`` unless ``as_string=False``).

    ``input_shape``: the model gets one tensor of that shape (the parameters' dtype and device) as its
    only argument; else ``args``/``kwargs``. ``mode="generate"`` profiles ``model.generate`` instead.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"get_model_profile: model must be a torch.nn.Module, got {type(model).__name__}")
    if mode not in ("forward", "generate"):
        raise ValueError(f"get_model_profile: mode must be 'forward' or 'generate', got {mode!r}")
    kwargs = dict(kwargs or {})
    if input_shape is not None:
        if not isinstance(input_shape, tuple) or not input_shape:
            raise TypeError(f"get_model_profile: input_shape must be a non-empty tuple, got {input_shape!r}")
        first = next(model.parameters(), None)
        like = {"dtype": first.dtype, "device": first.device} if first is not None else {}
        args = (torch.empty(input_shape, **like).normal_() if not like or like["dtype"].is_floating_point
                else torch.zeros(input_shape, **like),)
    if not args and not kwargs:
        raise TypeError("get_model_profile: give input_shape=, or args= / kwargs= for the model")
    call = model.generate if mode == "generate" else model
    model.eval()
    with torch.no_grad():
        for _ in range(warm_up):
            call(*args, **kwargs)
        profiler = FlopsProfiler(model)
        profiler.start_profile(ignore_list=ignore_modules)
        call(*args, **kwargs)
        profiler.stop_profile()
    if print_profile:
        profiler.print_model_profile(profile_step=warm_up, module_depth=module_depth, top_modules=top_modules,
                                     detailed=detailed, output_file=output_file)
    profiler.end_profile()
    if as_string:
        return profiler.get_total_flops(True), profiler.get_total_macs(True), profiler.get_total_params(True)
    return profiler.get_total_flops(), profiler.get_total_macs(), profiler.get_total_params()


__all__ = ["FlopsProfiler", "get_model_profile"]

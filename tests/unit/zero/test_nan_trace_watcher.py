"""The inf/NaN trace (engine/nan_trace.py) as a watcher: its own failure is one warning and training
goes on; engine.compile() takes its hooks off (they would change what compiles); off by default (5% of a
step on an H100, benchmarks/RESULTS.md 2026-12-07), no hook is set."""
import torch

from launcher import zero
from launcher.zero.engine.compiling import hooked_modules

CONFIG = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "non_finite": {"trace": True}}


class Refuses(torch.Tensor):
    """A tensor whose sum raises: the trace's reduction fails on it, nothing else uses a sum."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.sum:
            raise RuntimeError("no sum here")
        return super().__torch_function__(func, types, args, kwargs or {})


class Wrap(torch.nn.Module):
    def forward(self, x):
        return x.as_subclass(Refuses)


class Odd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.wrap = Wrap()

    def forward(self, x):
        return self.wrap(self.linear(x)).pow(2).mean().as_subclass(torch.Tensor)


def test_the_trace_failing_is_one_warning_and_every_step_is_applied(capsys):
    torch.manual_seed(0)
    engine, *_ = zero.initialize(model=Odd(), config=CONFIG)
    try:
        for _ in range(3):
            engine.backward(engine(torch.randn(2, 4)))
            engine.step()
    finally:
        torch.distributed.destroy_process_group()
    err = capsys.readouterr().err
    assert err.count("inf/NaN tracing off: RuntimeError: no sum here; training goes on") == 1, err
    assert engine.global_steps == 3 and engine.skipped_steps == 0
    assert not hooked_modules(engine.module)


def test_compile_takes_the_traces_hooks_off():
    torch.manual_seed(0)
    engine, *_ = zero.initialize(model=torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)),
                                 config=CONFIG)
    try:
        engine.backward(engine(torch.randn(2, 4)).sum())
        engine.step()
        assert len(hooked_modules(engine.module)) == 3     # the trace's, on every module
        engine.compile(backend="eager")
        assert not hooked_modules(engine.module)
    finally:
        torch.distributed.destroy_process_group()


def test_the_trace_is_off_by_default_and_hooks_nothing():
    torch.manual_seed(0)
    config = {key: value for key, value in CONFIG.items() if key != "non_finite"}
    engine, *_ = zero.initialize(model=torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)),
                                 config=config)
    try:
        engine.backward(engine(torch.randn(2, 4)).sum())
        engine.step()
        assert not hooked_modules(engine.module) and engine.global_steps == 1
    finally:
        torch.distributed.destroy_process_group()

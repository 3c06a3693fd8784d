"""A bf16 step with the optimizer on the device reads as few numbers from the device as its
semantics allow: with ``check_grad_overflow: false`` none (the clip factor stays a device tensor,
the norm is read only when asked for), with the default overflow check one (the norm and the
overflow flag together). The loss is read only for a step that prints or records it. Same
weights and norms as the step that reads them (one rank, gloo, CPU)."""
import dataclasses
import math
import os
import sys

import pytest
import torch

from launcher import zero
from launcher.zero.stages.base import clip_factor
from tests.helpers.tiny import bf16_square_loss_steps


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("norm, scale, clip", [
    (0.5, 1.0, 1.0), (3.0, 1.0, 1.0), (3.0, 1.0, 0.0), (1e-3, 1.0, 1e-2), (12.0, 4.0, 1.0),
    (float("inf"), 1.0, 1.0), (float("nan"), 1.0, 1.0), (float("inf"), 1.0, 0.0)])
def test_clip_factor_is_the_engines_float_arithmetic(norm, scale, clip):
    total = torch.tensor(norm * norm, dtype=torch.float64)
    # the float path of Engine._take_model_step: an overflow there makes the norm infinite
    unscaled = float("inf") if not math.isfinite(norm) else norm / scale
    combined = scale * max(1.0, (unscaled + 1e-6) / clip) if clip > 0 else scale
    got = float(clip_factor(total, scale, clip))
    assert got == pytest.approx(1.0 / combined, rel=1e-12, abs=0.0)


def build(stage, clip, steps_per_print=None, check_overflow=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.Tanh(), torch.nn.Linear(512, 300),
                                torch.nn.Tanh(), torch.nn.Linear(300, 4))
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": clip, "bf16": {"enabled": True, "check_grad_overflow": check_overflow},
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 1000},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}}
    if steps_per_print:
        config["steps_per_print"] = steps_per_print
    engine, _, _, _ = zero.initialize(model=model, config=config)
    return engine


def run(engine, steps=3, sync_free=True):
    if not sync_free:
        engine._step_rules = dataclasses.replace(engine._step_rules, sync_free=False)
    norms = bf16_square_loss_steps(engine, steps)
    return [p.detach().clone() for p in engine.module.parameters()], norms


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("clip", [0.05, 0.0, 100.0])
def test_sync_free_step_trains_exactly_like_the_step_that_reads_the_norm(stage, clip):
    expected, expected_norms = run(build(stage, clip), sync_free=False)
    torch.distributed.destroy_process_group()
    engine = build(stage, clip)
    assert engine._norm_may_stay_on_device()
    got, norms = run(engine)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert norms == pytest.approx(expected_norms, rel=1e-6)


class CountReads:
    """Counts the engine's tensor-to-number conversions (each one a host sync on a GPU); torch's
    own CPU optimizer reads its CPU step counter, which a GPU run does not."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ("item", "__float__", "__bool__", "tolist"):
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                caller = sys._getframe(1).f_code.co_filename
                if os.path.join("launcher", "zero") in caller:
                    self.count += 1
                return _original(tensor, *args, **kwargs)
            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_bf16_step_reads_no_number_from_the_device(stage, monkeypatch):
    engine = build(stage, clip=0.05)
    run(engine, steps=1)                       # the optimizer state is built
    x = torch.randn(8, 16).to(torch.bfloat16)
    engine.backward(engine(x).float().pow(2).mean())
    reads = CountReads(monkeypatch)
    engine.step()
    assert reads.count == 0
    assert engine.get_global_grad_norm() > 0   # read when asked for
    assert reads.count > 0


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_with_the_overflow_check_a_step_reads_one_number(stage, monkeypatch):
    engine = build(stage, clip=0.05, check_overflow=True)
    assert not engine._norm_may_stay_on_device()
    run(engine, steps=1)
    x = torch.randn(8, 16).to(torch.bfloat16)
    engine.backward(engine(x).float().pow(2).mean())
    reads = CountReads(monkeypatch)
    engine.step()
    assert reads.count == 1                    # norm and overflow flag in one; the loss is not read


def test_the_loss_is_read_on_a_step_that_prints(capsys, monkeypatch):
    engine = build(2, clip=0.05, steps_per_print=2)
    run(engine, steps=1)
    x = torch.randn(8, 16).to(torch.bfloat16)
    engine.backward(engine(x).float().pow(2).mean())
    reads = CountReads(monkeypatch)
    engine.step()                              # step 2 prints its loss
    assert reads.count >= 1
    assert "loss=" in capsys.readouterr().out

"""What watches the step never fails it (STYLE.md): a FLOP count that fails, a metric writer that
fails, a profile that cannot be written are each one warning, and the job trains on as it would
have without them (issue 39: a Llama's first step died in the MFU counter)."""
import os

import pytest
import torch

from launcher import zero
from launcher.zero.flops.counter import FlopCounter
from tests.helpers.gpt import GPT, TINY

STEPS = 4


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def train(config: dict, prepare=None) -> tuple:
    """(losses, engine) of STEPS steps of the tiny GPT on fixed tokens; ``prepare(engine)`` before the first."""
    torch.manual_seed(0)
    engine, *_ = zero.initialize(model=GPT(TINY), config={
        "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, **config})
    if prepare is not None:
        prepare(engine)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS):
        idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len), generator=gen)
        loss = engine(idx, idx)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    engine.destroy()
    torch.distributed.destroy_process_group()
    return losses, engine


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if "warning:" in line]


def boom(*args, **kwargs):
    raise RuntimeError("formula exploded")


def test_a_failing_flop_formula_is_one_warning_and_training_goes_on_without_mfu(monkeypatch, capsys):
    reference, _ = train({})
    capsys.readouterr()
    monkeypatch.setenv("DSLAUNCH_PEAK_TFLOPS", "1e-6")

    def failing_mm(engine):   # the engine's own counter, with a formula for mm (every Linear's backward) that raises
        engine.instruments.counter = FlopCounter({torch.ops.aten.mm: boom})
    losses, engine = train({}, failing_mm)
    out, err = capsys.readouterr()
    assert losses == reference
    assert engine.instruments.flops_per_step is None
    assert warnings_in(err) == ["[zero] rank 0: warning: counting FLOPs failed at aten.mm: RuntimeError: formula "
                                "exploded; training goes on without MFU"]
    progress = [line for line in out.splitlines() if " progress " in line]
    assert len(progress) == STEPS and not any("mfu=" in line for line in progress)


def test_a_failing_count_at_the_profile_step_writes_no_profile_and_says_so(monkeypatch, capsys, tmp_path):
    def failing_mm(engine):
        engine.instruments.counter = FlopCounter({torch.ops.aten.mm: boom})
    profile = tmp_path / "profile.txt"
    train({"flops_profiler": {"enabled": True, "profile_step": 1, "output_file": str(profile)}}, failing_mm)
    assert not profile.exists()
    [warning] = warnings_in(capsys.readouterr().err)
    assert "counting FLOPs failed at aten.mm" in warning and "without MFU and the flops profile" in warning


def test_an_unwritable_profile_is_one_warning(capsys, tmp_path):
    (tmp_path / "a_file").write_text("")
    output = tmp_path / "a_file" / "profile.txt"   # its folder is a file: cannot be created
    reference, _ = train({})
    losses, engine = train({"flops_profiler": {"enabled": True, "profile_step": 1, "output_file": str(output)}})
    assert losses == reference and engine.instruments.flops_per_step
    [warning] = warnings_in(capsys.readouterr().err)
    assert f"flops profile of step 1 not written ({output})" in warning and "training goes on" in warning


class BrokenService:
    """A metric service whose writes fail (the network went away)."""

    def __init__(self):
        self.calls = 0

    def write(self, step, values):
        self.calls += 1
        raise ConnectionError("service unreachable")


def test_failing_metric_writers_are_one_warning_each_and_dropped(capsys, tmp_path):
    reference, _ = train({})
    service = BrokenService()

    def break_writers(engine):
        engine.monitor.services.append(service)
        csv_dir = engine.monitor.csv_dir
        os.rmdir(csv_dir)
        open(csv_dir, "w").close()        # the CSV folder became a file: every write fails
    capsys.readouterr()
    losses, engine = train({"csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "job"}},
                           break_writers)
    assert losses == reference
    assert service.calls == 1 and engine.monitor.services == [] and engine.monitor.csv_dir is None
    found = warnings_in(capsys.readouterr().err)
    assert len(found) == 2, found
    assert found[0].startswith("[zero] rank 0: warning: csv_monitor: could not write the metrics of sample 2 "
                               "(NotADirectoryError")
    assert found[1] == ("[zero] rank 0: warning: BrokenService: could not write the metrics of sample 2 "
                        "(ConnectionError: service unreachable); training goes on without it")


def test_a_service_that_cannot_start_is_one_warning(monkeypatch, capsys):
    import types

    fake = types.ModuleType("wandb")
    fake.init = boom
    monkeypatch.setitem(__import__("sys").modules, "wandb", fake)
    reference, _ = train({})
    losses, engine = train({"wandb": {"enabled": True}})
    assert losses == reference and engine.monitor.services == []
    assert warnings_in(capsys.readouterr().err) == [
        "[zero] rank 0: warning: wandb: could not start (RuntimeError: formula exploded); training goes on without it"]


def test_deepspeeds_flops_profiler_api_reports_nothing_rather_than_a_partial_count(capsys):
    from launcher.zero.flops.profiler import FlopsProfiler

    layer = torch.nn.Linear(8, 4)
    profiler = FlopsProfiler(layer)
    profiler._counter = FlopCounter({torch.ops.aten.addmm: boom})
    profiler.start_profile()
    out = layer(torch.randn(3, 8))
    profiler.end_profile()
    assert out.shape == (3, 4) and profiler.get_total_flops() == 0
    assert warnings_in(capsys.readouterr().err) == [
        "[zero] warning: flops profiler: counting FLOPs failed at aten.addmm: RuntimeError: formula exploded; "
        "no FLOPs reported"]

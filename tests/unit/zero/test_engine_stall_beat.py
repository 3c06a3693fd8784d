"""--stall_timeout, the rank's side: the engines bump the progress file the launcher names in
DSLAUNCH_PROGRESS_FILE (launcher/zero/stall_beat.py), from the moment the engine is ready. One rank, gloo, CPU."""
import faulthandler
import signal

import pytest
import torch

import launcher.zero.stall_beat as stall_beat
from launcher import zero
from launcher.node.stall import read_progress
from launcher.zero.pipe import LayerSpec, PipelineModule

CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
          "optimizer": {"type": "Adam", "params": {"lr": 0.1}}}


@pytest.fixture
def progress_file(tmp_path, monkeypatch):
    """A fresh progress file for this test (the module opens it once per process)."""
    path = tmp_path / "rank_0.progress"
    monkeypatch.setenv(stall_beat.ENV_VARIABLE, str(path))
    monkeypatch.setattr(stall_beat, "_state", {"fd": None, "events": 0, "opened": False})
    yield path
    if stall_beat._state["fd"] is not None:
        import os
        os.close(stall_beat._state["fd"])
    faulthandler.unregister(signal.SIGUSR1)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_the_engine_reports_ready_then_each_forward_backward_and_step(progress_file):
    torch.manual_seed(0)
    engine, *_ = zero.initialize(model=torch.nn.Linear(2, 2), config={**CONFIG, "gradient_accumulation_steps": 1})
    assert read_progress(str(progress_file)) == (1, -1)   # ready, before its first step
    x = torch.randn(1, 2)
    engine.backward(engine(x).square().mean())
    engine.step()
    assert read_progress(str(progress_file)) == (4, 0)
    engine.backward(engine(x).square().mean())
    assert read_progress(str(progress_file)) == (6, 1)


def test_the_pipeline_engine_reports_ready_and_each_batch_before_its_step(progress_file):
    torch.manual_seed(0)
    module = PipelineModule([LayerSpec(torch.nn.Linear, 2, 2), LayerSpec(torch.nn.Linear, 2, 2)], num_stages=1,
                            loss_fn=torch.nn.functional.mse_loss)
    engine, *_ = zero.initialize(model=module, config=CONFIG)
    assert read_progress(str(progress_file)) == (1, -1)
    x = torch.randn(1, 2)
    engine.train_batch(iter([(x, x)] * 2))
    assert read_progress(str(progress_file)) == (3, 0)   # the batch began; its micro-batches ran
    engine.eval_batch(iter([(x, x)] * 2))
    assert read_progress(str(progress_file)) == (4, 1)


def test_the_documented_old_path_still_beats():
    """Scripts that call launcher.zero.progress.beat (the path documented before the module's rename) keep working."""
    import launcher.zero.progress as old_path
    assert old_path.beat is stall_beat.beat

"""W&B and Comet get the monitor's metrics from rank 0 through the real packages, run offline, and the
values are read back from what the packages wrote; a missing package is one warning."""
import builtins
import glob
import io
import json
import os
import zipfile

import pytest
import torch

from launcher import zero
from launcher.zero.config.load import load_config
from launcher.zero.engine.monitor import Monitor
from tests.helpers import wandb_log


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def train(config, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    engine, *_ = zero.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **config})
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    for service in engine.monitor.services:
        service.close()
    return engine, losses


def test_wandb_logs_loss_lr_grad_norm_and_skipped_steps_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    engine, losses = train({"wandb": {"enabled": True, "project": "watch", "group": "g1", "job_name": "run-a"}})
    wandb.teardown()   # wandb's service writes the run file behind finish(); at exit it waits, here we ask
    rows = wandb_log.history(str(tmp_path))
    assert [row["_step"] for row in rows] == [4, 8, 12]   # the global sample count, as DeepSpeed
    assert [row["Train/Samples/train_loss"] for row in rows] == pytest.approx(losses)
    assert all(row["Train/Samples/lr"] == pytest.approx(0.1) for row in rows)
    assert rows[-1]["Train/Samples/grad_norm"] == pytest.approx(engine.get_global_grad_norm())
    assert [row["Train/Samples/skipped_steps"] for row in rows] == [0, 0, 0]
    assert "Train/Samples/samples_per_second" in rows[-1]
    assert wandb_log.run_facts(str(tmp_path)) == {"project": "watch", "group": "g1", "name": "run-a"}


def test_comet_logs_the_same_metrics_to_an_offline_experiment(tmp_path, monkeypatch):
    pytest.importorskip("comet_ml")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    _, losses = train({"comet": {"enabled": True, "online": False, "project": "watch", "samples_log_interval": 8}},
                      steps=5)
    [archive] = glob.glob(str(tmp_path / "*.zip"))
    with zipfile.ZipFile(archive) as zipped:
        text = zipped.read("messages.json").decode()
        project = json.loads(zipped.read("experiment.json"))["project_name"]
    metrics = [json.loads(line)["payload"]["metric"] for line in text.splitlines() if '"metric_msg"' in line]
    loss = [(m["step"], m["metricValue"]) for m in metrics if m["metricName"] == "Train/Samples/train_loss"]
    # samples_log_interval 8 with 4 samples a step: steps at samples 4, 12, 20 are logged
    assert [s for s, _ in loss] == [4, 12, 20]
    assert [v for _, v in loss] == pytest.approx([losses[0], losses[2], losses[4]])
    assert project == "watch"


def test_a_missing_package_is_one_warning_and_training_goes_on(monkeypatch):
    real_import = builtins.__import__

    def no_services(name, *args, **kwargs):
        if name in ("wandb", "comet_ml"):
            raise ImportError(f"No module named '{name}'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_services)
    err = io.StringIO()
    config = load_config({"train_batch_size": 1, "wandb": {"enabled": True}, "comet": {"enabled": True}})
    monitor = Monitor(config, rank=0, out=io.StringIO(), err=err)
    assert monitor.services == [] and not monitor.records
    lines = err.getvalue().splitlines()
    assert lines == ["[zero] rank 0: warning: wandb.enabled is set but the wandb package is not installed; "
                     "pip install wandb (continuing without it)",
                     "[zero] rank 0: warning: comet.enabled is set but the comet_ml package is not installed; "
                     "pip install comet_ml (continuing without it)"]
    monitor.events(4, {"Train/Samples/train_loss": 1.0})


def test_other_ranks_open_no_service(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    config = load_config({"train_batch_size": 1, "wandb": {"enabled": True}})
    assert Monitor(config, rank=1, out=io.StringIO(), err=io.StringIO()).services == []


def test_deepspeeds_monitor_keys_load():
    config = load_config({"train_batch_size": 1,
                          "wandb": {"enabled": False, "project": "p", "group": "g", "team": "t"},
                          "comet": {"enabled": False, "samples_log_interval": 50, "workspace": "w", "api_key": "k",
                                    "experiment_name": "e", "online": False, "mode": "get_or_create"},
                          "flops_profiler": {"enabled": True, "profile_step": 3, "module_depth": 2, "top_modules": 3,
                                             "detailed": False, "output_file": None, "recompute_fwd_factor": 1.0}})
    assert config.wandb.team == "t" and config.comet.samples_log_interval == 50
    assert config.flops_profiler.profile_step == 3 and "flops_profiler" not in config.unsupported

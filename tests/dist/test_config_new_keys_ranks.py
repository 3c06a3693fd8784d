"""A DeepSpeed 0.16-0.19 key this engine does not build stops the job at start (issue 41 item 3):
``dslaunch --dry-run --config`` refuses the config before any rank starts, and a script that passes
it to ``initialize`` ends every rank with one message for the job, exit code 2, no traceback."""
import json
import os
import subprocess
import sys

from tests.helpers.world import REPO, free_port

CONFIG_WORKER = REPO / "tests" / "dist" / "workers" / "config_worker.py"
ZENFLOW = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.05, "update_interval": 4}}}


def dslaunch(*args, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("DSLAUNCH_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "launcher", "--master_port", str(free_port()), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=str(REPO), env=env)


def test_the_dry_run_refuses_a_key_that_is_not_built(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ZENFLOW))
    done = dslaunch("--num_gpus", "2", "--dry-run", "--config", str(path), str(CONFIG_WORKER))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"dslaunch: config error: {path}: zero_optimization.zenflow " in done.stderr
    assert "not built in dslaunch's engine" in done.stderr and "hint: " in done.stderr


def test_a_rank_that_passes_it_to_initialize_ends_the_job_with_one_message(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ZENFLOW))
    done = dslaunch("--num_gpus", "2", "--no_local_rank", str(CONFIG_WORKER), str(path))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert done.stderr.count("zero_optimization.zenflow ") == 1, done.stderr
    assert "config error" in done.stderr and "\"ratio\": 0.3" in done.stderr   # the hint: the knob that is built

"""What a user sees when every rank fails alike: one message for the job, with a hint that fits."""
import json
import os
import re
import subprocess
import sys

from tests.helpers.world import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_WORKER = os.path.join(ROOT, "tests", "dist", "workers", "config_worker.py")
PLAIN_ARGPARSE = os.path.join(ROOT, "tests", "scripts", "plain_argparse.py")


def dslaunch(*args, timeout=120):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DSLAUNCH_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "launcher", "--master_port", str(free_port()), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def write_config(tmp_path, config):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_a_mistyped_config_key_is_one_message_for_the_job_not_a_traceback_per_rank(tmp_path):
    path = write_config(tmp_path, {"train_batch_size": 2, "zero_optimisation": {"stage": 2},
                                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    done = dslaunch("--num_gpus", "2", "--no_local_rank", CONFIG_WORKER, path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert done.stderr.count("unknown config key 'zero_optimisation'") == 1, done.stderr
    # the rank that reaches the typo first says it: rank 0, unless it lags the others by seconds
    said = re.search(rf"\[rank (\d+)\] dslaunch: config error: {re.escape(path)}: unknown config key 'zero_optimisation'",
                     done.stderr)
    assert said, done.stderr
    assert "did you mean 'zero_optimization'?" in done.stderr
    assert f"rank {said.group(1)} on" in done.stderr and "stopped it on a config error" in done.stderr


def test_an_unknown_optimizer_type_is_the_same_one_message(tmp_path):
    path = write_config(tmp_path, {"train_batch_size": 2, "optimizer": {"type": "AdamWW", "params": {}}})
    done = dslaunch("--num_gpus", "2", "--no_local_rank", CONFIG_WORKER, path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("unknown optimizer 'AdamWW'") == 1, done.stderr


def test_argparse_rejecting_local_rank_points_to_no_local_rank():
    done = dslaunch("--num_gpus", "2", PLAIN_ARGPARSE)
    assert done.returncode == 2, done.stderr
    assert "unrecognized arguments: --local_rank=" in done.stderr
    assert "hint: the script's argparse rejects the --local_rank=N" in done.stderr
    assert "pass --no_local_rank" in done.stderr
    assert "not a dslaunch usage error" in done.stderr
    followed = dslaunch("--num_gpus", "2", "--no_local_rank", PLAIN_ARGPARSE)   # the hint's advice works
    assert followed.returncode == 0 and "hint:" not in followed.stderr, followed.stderr


def test_ctrl_c_ends_engine_ranks_quietly_with_one_line_from_dslaunch(tmp_path):
    import signal
    import time

    path = write_config(tmp_path, {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DSLAUNCH_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "--master_port", str(free_port()), "--num_gpus", "2",
                             "--no_local_rank", CONFIG_WORKER, path, "sleep"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    seen = 0
    deadline = time.monotonic() + 60
    while seen < 2 and time.monotonic() < deadline:
        seen += "initialized" in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert [line for line in err.splitlines() if "stopped by SIGINT" in line] == \
        ["dslaunch: stopped by SIGINT; every rank was stopped"]

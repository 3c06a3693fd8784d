"""A failing start is one message for the job in every run, also under load and on 4 ranks (issue 33).

Each case is launched 20 times (DSLAUNCH_SOAK_RUNS) while a process burns a core: the rank
that reaches the error first and the one the launcher hears from first vary from run to run,
which is where a traceback from a rank failing on its peer's vanished store used to show.
"""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers.world import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKERS = os.path.join(ROOT, "tests", "dist", "workers")
RUNS = int(os.environ.get("DSLAUNCH_SOAK_RUNS", "20"))

CASES = {   # name -> (worker, config, the message's words)
    "key typo": ("config_worker.py", {"train_batch_size": 4, "zero_optimisation": {"stage": 2},
                                      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}},
                 "unknown config key 'zero_optimisation'"),
    "unknown optimizer": ("config_worker.py", {"train_batch_size": 4, "optimizer": {"type": "AdamWW", "params": {}}},
                          "unknown optimizer 'AdamWW'"),
    "zero.Init config": ("init_config_worker.py", {"train_batch_size": 4, "zero_optimization": {"stage": 3},
                                                   "fp61": {"enabled": True}},
                         "unknown config key 'fp61'"),
}


@pytest.fixture
def cpu_burner():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    burner.kill()
    burner.wait(timeout=30)


@pytest.mark.soak
@pytest.mark.timeout(900)   # 20 launches of 2 or 4 ranks beside a burner: 120 s at load 15
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_config_error_is_one_message_in_every_run_under_load(tmp_path, cpu_burner, case, ranks):
    worker, config, words = CASES[case]
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DSLAUNCH_DEBUG", None)
    failures = []
    for run in range(RUNS):
        done = subprocess.run([sys.executable, "-m", "launcher", "--master_port", str(free_port()), "--num_gpus",
                               str(ranks), "--no_local_rank", os.path.join(WORKERS, worker), str(path)],
                              capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        output = done.stdout + done.stderr
        said = re.findall(r"\[rank \d+\] dslaunch: config error: .*" + re.escape(words), done.stderr)
        if done.returncode != 2 or "Traceback" in output or len(said) != 1 or "went away" in output:
            failures.append(f"run {run}: exit {done.returncode}, {len(said)} messages:\n{done.stderr[-3000:]}")
    assert not failures, f"{len(failures)} of {RUNS} runs:\n" + "\n".join(failures[:3])

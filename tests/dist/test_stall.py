"""--stall_timeout on local ranks: a rank stuck inside a step while its peers wait in the
all-reduce is named with its host and step, every rank's Python stack is printed, and the job
stops (issue 33 item 3). The cluster version is in tests/cluster/test_stall_cluster.py."""
import os
import subprocess
import sys

from tests.helpers.world import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "dist", "workers", "stall_worker.py")


def dslaunch(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DSLAUNCH_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "launcher", "--master_port", str(free_port()), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_a_rank_stuck_in_a_step_is_named_with_its_stack_and_the_job_stops():
    done = dslaunch("--num_gpus", "3", "--no_local_rank", "--stall_timeout", "4", WORKER, "1")
    err = done.stderr
    assert done.returncode == 137, err
    assert "finished" not in done.stdout
    said = [line for line in err.splitlines() if "is stuck after" in line]
    assert len(said) == 1, err
    assert said[0].startswith("dslaunch: rank 1 on localhost is stuck after step 2: no progress for"), said
    assert "went on (in the same step; --stall_timeout 4)" in said[0]
    # every rank's stack: the stuck one inside its sleep, the others inside the step's collective
    assert "[rank 1] " in err and "in sleep_inside_the_step" in err, err
    for rank in (0, 2):
        assert f"[rank {rank}] Current thread" in err or f"[rank {rank}] Thread" in err, err
    assert "rank 1 on localhost was stopped as stuck" in err


def test_without_stall_timeout_nothing_is_watched():
    done = dslaunch("--num_gpus", "2", "--no_local_rank", "--stall_timeout", "0", WORKER, "1")
    assert done.returncode == 2 and "--stall_timeout must be a number of seconds > 0" in done.stderr

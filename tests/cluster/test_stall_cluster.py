"""--stall_timeout on the real test cluster: a rank on node2 stuck inside a training step, while
the others wait in the step's all-reduce, is named with its host and step, and the stack of
every rank on node2 reaches dslaunch's console through the agent (issue 33 item 3)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "dist", "workers", "stall_worker.py")

pytestmark = pytest.mark.cluster


def test_a_stuck_remote_rank_is_named_with_the_stacks_of_its_node(cluster_hostfile):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "launcher", "-H", str(cluster_hostfile(2)), "--launcher", "ssh",
                           "--no_local_rank", "--stall_timeout", "5", WORKER, "3"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    err = done.stderr
    assert done.returncode == 137, err
    said = [line for line in err.splitlines() if "is stuck after" in line]
    assert len(said) == 1 and said[0].startswith("dslaunch: rank 3 on node2 is stuck after step 2"), err
    assert "in sleep_inside_the_step" in err
    assert "[rank 2] Current thread" in err or "[rank 2] Thread" in err, err
    assert "rank 3 on node2 was stopped as stuck" in err

"""32 real nodes (1 slot each): every rank starts, and one failure stops every node quickly.

The session's cluster has 3 nodes; this module brings up 32 for its tests and puts the
cluster back to the size it found after, so the other modules see what they expect.
"""
import os
import subprocess
import sys
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(ROOT, "scripts", "local-cluster")
NODES = 32
JOB = """import os, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print("pid", os.getpid(), "rank", rank, flush=True)
if sys.argv[1] == "fail":
    if rank == world - 1:
        time.sleep(3)
        sys.exit(1)
    time.sleep(120)
"""

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def hosts32(cluster, tmp_path_factory):
    before = cluster.nodes
    up = subprocess.run([CLUSTER, "up", str(NODES)], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr[-500:]
    work = tmp_path_factory.mktemp("scale")
    (work / "job.py").write_text(JOB)
    (work / "hosts").write_text("".join(f"node{k} slots=1\n" for k in range(1, NODES + 1)))
    yield work
    subprocess.run([CLUSTER, "up", str(before)], capture_output=True, text=True, timeout=300)


def dslaunch(work, runner, mode):
    return subprocess.run([sys.executable, "-m", "launcher", "-H", str(work / "hosts"), "--launcher", runner,
                           "--no-preflight", "--no_local_rank", str(work / "job.py"), mode],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)


def pids(text):
    return [int(line.split()[line.split().index("pid") + 1]) for line in text.splitlines() if " pid " in line]


@pytest.mark.parametrize("runner", ["ssh", "pdsh"])
def test_every_rank_on_32_nodes_runs(hosts32, runner):
    done = dslaunch(hosts32, runner, "ok")
    assert done.returncode == 0, done.stderr[-800:]
    ranks = {int(line.rsplit(" ", 1)[1]) for line in done.stdout.splitlines() if " rank " in line}
    assert ranks == set(range(NODES))


@pytest.mark.parametrize("runner", ["ssh", "pdsh"])
def test_one_failure_on_32_nodes_stops_every_rank(hosts32, runner):
    started = time.time()
    done = dslaunch(hosts32, runner, "fail")
    took = time.time() - started
    assert done.returncode == 1, done.stderr[-800:]
    assert took < 60, f"the job took {took:.1f}s to end after one rank failed"
    time.sleep(0.2)
    left = [p for p in pids(done.stdout) if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert len(pids(done.stdout)) == NODES and left == []

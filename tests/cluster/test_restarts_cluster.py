"""--max_restarts and --min_nodes on the real test cluster (real sshd, ssh and pdsh runners)."""
import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = os.path.join(ROOT, "tests", "scripts", "ranks.py")

pytestmark = pytest.mark.cluster


def dslaunch(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_a_remote_rank_that_crashes_once_is_restarted_on_every_node(cluster_hostfile, tmp_path, launcher):
    marker = tmp_path / "crashed"
    done = dslaunch("-H", str(cluster_hostfile(2)), "--launcher", launcher, "--max_restarts", "1",
                    RANKS, "crash-once", "3", str(marker))
    assert done.returncode == 0, done.stderr
    restart = [line for line in done.stderr.splitlines() if "restart 1/1:" in line]
    assert len(restart) == 1 and "rank 3 on node2" in restart[0] and "code 3" in restart[0], done.stderr
    assert done.stdout.count('"DSLAUNCH_RESTART_COUNT": "1"') == 4
    assert "1 of 1 restart(s) used" in done.stderr


def test_a_remote_rank_that_crashes_every_time_exits_with_its_code(cluster_hostfile):
    done = dslaunch("-H", str(cluster_hostfile(2)), "--launcher", "ssh", "--no-preflight", "--max_restarts", "2",
                    RANKS, "crash-always", "2", "6")
    assert done.returncode == 6, done.stderr
    assert "no restart left" in done.stderr and "2 of 2 restart(s) used" in done.stderr


def test_a_cut_node_is_dropped_and_the_job_finishes_on_the_two_left(cluster_hostfile, healthy_cluster):
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "-H", str(cluster_hostfile(3)), "--launcher", "ssh",
                             "--heartbeat_timeout", "3", "--max_restarts", "1", "--min_nodes", "2",
                             RANKS, "first-try-sleeps"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    seen = []
    while len([line for line in seen if "TRY 0" in line]) < 6:
        seen.append(proc.stdout.readline())
        assert seen[-1], "the first try did not start 6 ranks"
    healthy_cluster.cut(3)
    cut_at = time.monotonic()
    try:
        first_on_survivors = None
        while True:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "TRY 1" in line and first_on_survivors is None:
                first_on_survivors = time.monotonic() - cut_at
        _out, err = proc.communicate(timeout=120)
    finally:
        healthy_cluster.heal(3)
    assert proc.returncode == 0, err
    second = [line for line in seen if "TRY 1" in line]
    assert len(second) == 4
    assert {re.search(r"WORLD (\d+)", line).group(1) for line in second} == {"4"}
    assert {re.search(r"NODE (\d+)", line).group(1) for line in second} == {"0", "1"}
    assert {re.search(r"MASTER (\S+)", line).group(1) for line in second} == {"10.213.0.1"}
    restart = [line for line in err.splitlines() if "restart 1/1:" in line]
    assert len(restart) == 1 and "node 2 (node3) lost" in restart[0], err
    assert "2 remaining node(s), world size 4" in restart[0]
    assert err.count("preflight ok") == 2, err  # the checks ran again, on the survivors
    print(f"cut -> first rank line on the survivors: {first_on_survivors:.1f} s")

"""The short chaos run on a cluster (scripts/chaos.py --cluster): one round of each fault only a
cluster has (an agent's SIGKILL, a cut link, sshd stopped before a restart) and of a stuck rank
alone on its node (found only by dslaunch's job-wide --stall_timeout watch) on 3 nodes x 1 rank;
no process left on any node, the documented exit code, weights equal to the single-process
reference. It makes its own cluster (DSL_CLUSTER_NAME=chaosc, 10.213.M.0/24) and takes it down, so
the default cluster the other tests share is neither used nor touched."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = "chaosc"

pytestmark = pytest.mark.cluster


@pytest.fixture
def root_and_tools():
    if os.geteuid() != 0:
        pytest.skip("a test cluster needs root (network namespaces, sshd)")
    missing = [t for t in ("ip", "ssh", "ssh-keygen", "unshare", "/usr/sbin/sshd", "pdsh") if not shutil.which(t)]
    if missing:
        pytest.skip(f"a test cluster needs {', '.join(missing)}")


@pytest.mark.timeout(900)   # 4 rounds on 3 nodes; the same bound as chaos.py's below
def test_one_round_of_each_cluster_fault_passes_and_leaves_nothing(root_and_tools):
    default_namespaces = _namespaces("dsl-n")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "chaos.py"), "--cluster", NAME,
                           "--rounds", "4", "--seed", "5", "--kinds", "kill_agent,cut_link,sshd_stopped,stuck_rank"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    for kind in ("kill_agent", "cut_link", "sshd_stopped", "stuck_rank"):
        assert re.search(rf"^\| {kind} \| 1 \| 1 \| 0 \| 0 \| 0 \| 0 \|$", done.stdout, re.M), done.stdout
    # each fault was done to a running job, not to one that had ended
    assert re.search(r"kill_agent: passed \((ssh|pdsh): SIGKILL agent \d+, exit 0;", done.stdout), done.stdout
    assert re.search(r"cut_link: passed \((ssh|pdsh): cut node \d, exit 0;", done.stdout), done.stdout
    assert re.search(r"sshd_stopped: passed \((ssh|pdsh): sshd of node \d stopped, rank pid \d+ killed, exit 0;",
                     done.stdout), done.stdout
    # its cluster is gone, the default one untouched
    assert _namespaces(f"dsl-{NAME}-n") == []
    assert not os.path.exists(f"/run/dslaunch-cluster-{NAME}")
    with open("/etc/hosts", encoding="utf-8") as handle:
        assert f"{NAME}-node1" not in handle.read()
    # every default-cluster node that was up is still up (another session may bring it up meanwhile)
    assert set(default_namespaces) <= set(_namespaces("dsl-n"))


def _namespaces(prefix: str) -> list[str]:
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return sorted(n for n in names if re.fullmatch(rf"{re.escape(prefix)}\d+", n))

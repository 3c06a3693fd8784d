"""`--output` across nodes: the agents do not send what the console will not show, and say how much."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = os.path.join(ROOT, "tests", "scripts", "ranks.py")

pytestmark = pytest.mark.cluster


def test_rank0_mode_over_ssh_counts_the_lines_the_agents_held(healthy_cluster, tmp_path):
    hosts = str(healthy_cluster.hostfile(tmp_path / "hosts", 2, slots=2))
    done = subprocess.run([sys.executable, "-m", "launcher", "-H", hosts, "--launcher", "ssh", "--no-preflight",
                           "--output", "rank0", RANKS, "nap", "0"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert set(re.findall(r"^\[rank (\d+)\]", done.stdout, re.MULTILINE)) == {"0"}
    # ranks 1-3 print their pid line and 'rested': held on their nodes, counted in each agent's "done"
    assert "dslaunch: --output rank0: 6 rank output lines not shown; pass --log_dir DIR" in done.stderr

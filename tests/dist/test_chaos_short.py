"""The short chaos run (scripts/chaos.py): a round of every fault kind it has, on local ranks;
no process left, the documented exit codes, weights equal to the single-process reference."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(1500)   # 7 rounds of a real job; its own bound is chaos.py's (1500 s below)
def test_one_round_of_each_fault_kind_passes():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "chaos.py"), "--rounds", "7", "--seed", "3"],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # 7 kinds as root (full_disk mounts a tmpfs), else 6: every round passed, nothing left, no hang
    assert re.search(r"^\| all \| (\d+) \| \1 \| 0 \| 0 \| 0 \| 0 \|$", done.stdout, re.M), done.stdout

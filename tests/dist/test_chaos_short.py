"""The short chaos run (scripts/chaos.py): one round of every fault kind it has, on local ranks;
no process left, the documented exit codes, weights equal to the single-process reference."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_one_round_of_each_fault_kind_passes():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "chaos.py"), "--rounds", "6", "--seed", "3"],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "| all | 6 | 6 | 0 | 0 | 0 | 0 |" in done.stdout, done.stdout

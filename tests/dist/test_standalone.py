"""torchrun's `--standalone`: a real local job on a free port (--master_port 0 on this machine)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_standalone_all_reduce_on_two_cpu_ranks_picks_a_port_here():
    done = subprocess.run([sys.executable, "-m", "launcher", "--standalone", "--nproc_per_node", "2",
                           "examples/hello_dist.py"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "MASTER_PORT=0" not in done.stdout

"""scripts/bench_controller_sim.py runs at a tiny size: every agent gets its plan, every line is printed,
the failure stops every agent and the controller exits with the failed rank's code."""
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_controller_sim.py"


def test_the_controller_simulation_runs_tiny():
    out = subprocess.run([sys.executable, str(SCRIPT), "--agents", "6", "--ranks", "2", "--sims", "2",
                          "--seconds", "1", "--json"], capture_output=True, text=True, timeout=120, check=True)
    (run,) = json.loads(out.stdout)["results"]
    assert "error" not in run, run
    assert run["exit_code"] == 1 and run["stop_broadcast_s"] is not None
    assert run["lines_printed"] == run["lines_sent"] > 0

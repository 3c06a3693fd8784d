"""scripts/bench_activation_ckpt.py runs at a tiny size on CPU; checkpointing shrinks what is saved."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_activation_ckpt.py"


def test_bench_runs_tiny_and_checkpointing_saves_less():
    out = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--steps", "1", "--batch-sizes", "2"],
                         capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120, check=True)
    (run,) = json.loads(out.stdout)["runs"]
    assert run["plain"]["step_ms"] > 0 and run["checkpointed"]["step_ms"] > 0
    assert run["ratios"]["saved_activation"] < 0.5

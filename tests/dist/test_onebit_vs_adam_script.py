"""scripts/onebit_vs_adam.py at a tiny size: 2 gloo ranks, both optimizers, bytes reported."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "onebit_vs_adam.py"


def test_script_runs_tiny_and_reports_the_bytes_ratio():
    out = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--steps", "12", "--freeze-step", "4"],
                         capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=180, check=True)
    report = json.loads(out.stdout)
    assert report["loss_same_on_all_ranks"]
    assert report["bytes_per_step_per_rank"]["onebit_warmup"] == report["bytes_per_step_per_rank"]["fp32_allreduce"]
    assert 0 < report["compressed_over_fp32"] <= 1 / 16
    assert report["final_loss"]["adam"] > 0 and report["final_loss"]["onebit_adam"] > 0

"""scripts/bench_sparse_attention.py runs at a tiny size on CPU and reports both variants."""

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_sparse_attention.py"


def test_bench_runs_tiny_and_the_sparse_output_matches_masked_sdpa():
    out = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--iters", "1"], capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120, check=True)
    report = json.loads(out.stdout)
    assert set(report["results"]) == {"sdpa_causal", "sparse_fixed"}
    assert all("median_ms" in r for r in report["results"].values()), report["results"]
    assert report["check"]["max_abs_diff_vs_masked_sdpa"] < 1e-4
    assert 0 < report["layout"]["density_vs_causal"] < 1

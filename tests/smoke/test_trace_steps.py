"""scripts/trace_steps.py keeps working: a tiny stage-3 offload run on the CPU prints its per-step
times and writes a gzipped Chrome trace that holds the step's operators."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                      "scripts", "trace_steps.py")


def test_tiny_run_prints_times_and_writes_a_trace(tmp_path):
    trace = tmp_path / "trace.json.gz"
    env = dict(os.environ, MASTER_PORT="0")
    proc = subprocess.run([sys.executable, SCRIPT, "--variant", "zero3_offload_overlap", "--layers", "2",
                           "--width", "64", "--heads", "4", "--seq", "32", "--vocab", "256", "--batch", "2",
                           "--warmup", "1", "--steps", "3", "--trace", str(trace)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["variant"] == "zero3_offload_overlap" and len(record["host_ms"]) == 3
    assert all(t > 0 for t in record["device_ms"])
    events = json.load(gzip.open(trace))["traceEvents"]
    assert any(e.get("name") == "aten::linear" for e in events)

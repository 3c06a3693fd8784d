"""scripts/trace_summary.py: interval arithmetic, a synthetic GPU trace read the way a real one is,
and the command on a real trace from trace_steps.py (CPU)."""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from scripts import trace_summary as ts

SCRIPTS = os.path.dirname(os.path.abspath(ts.__file__))


@pytest.mark.parametrize("intervals, merged, total", [
    ([], [], 0),
    ([(0, 1)], [(0, 1)], 1),
    ([(0, 2), (1, 3)], [(0, 3)], 3),                  # overlap
    ([(0, 1), (1, 2)], [(0, 2)], 2),                  # touching
    ([(5, 6), (0, 1), (0.5, 0.7)], [(0, 1), (5, 6)], 2),   # unsorted, nested
])
def test_union_and_covered(intervals, merged, total):
    assert ts.union(intervals) == merged
    assert ts.covered(intervals) == pytest.approx(total)


def test_gaps_only_between_merged_intervals_and_long_enough():
    assert ts.gaps([(0, 10), (12, 20), (20, 25), (100, 101), (5, 8)], at_least=2) == [(10, 2), (25, 75)]
    assert ts.gaps([(0, 10), (11, 20)], at_least=2) == []


def test_outermost_keeps_parents_only():
    ev = [{"name": "child", "ts": 1, "dur": 2}, {"name": "parent", "ts": 0, "dur": 10},
          {"name": "grandchild", "ts": 1.5, "dur": 0.5}, {"name": "next", "ts": 10, "dur": 1}]
    assert [e["name"] for e in ts.outermost(ev)] == ["parent", "next"]


def _x(cat, name, ts_us, dur_us, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts_us, "dur": dur_us, "pid": 1, "tid": tid}


def test_summary_of_a_synthetic_gpu_step():
    events = [
        _x("kernel", "gemm", 0, 1000, tid=7), _x("kernel", "gemm", 500, 1000, tid=8),   # two streams overlap
        _x("kernel", "adam", 3000, 1000, tid=7),                                       # after a 1.5 ms gap
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 1500, 500, tid=9),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 4000, 1000, tid=9),
        _x("cuda_runtime", "cudaStreamSynchronize", 1600, 1200),
        _x("cpu_op", "aten::linear", 0, 400), _x("cpu_op", "aten::addmm", 100, 200),   # nested: not counted twice
        _x("cpu_op", "aten::linear", 500, 400),
        _x("cpu_op", "worker::adam", 0, 2500, tid=2),
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
    ]
    s = ts.summarize(events, gap_us=100, top=3)
    assert s["window_ms"] == pytest.approx(5.0)
    g = s["gpu"]
    assert g["kernels"] == 3 and g["kernel_busy_ms"] == pytest.approx(2.5)
    assert g["any_busy_ms"] == pytest.approx(4.0)        # kernels 0-1.5 and 3-4, copies 1.5-2 and 4-5
    assert g["copies_ms"] == {"DtoH": pytest.approx(0.5), "HtoD": pytest.approx(1.0)}
    assert g["gaps"] == 1 and g["longest_gaps"] == [{"at_ms": 1.5, "ms": 1.5}]
    assert s["host_waits_ms"] == {"cudaStreamSynchronize": pytest.approx(1.2)}
    worker, main = s["threads"]                          # the busiest thread first
    assert worker["tid"] == 2 and worker["busy_ms"] == pytest.approx(2.5)
    assert main["busy_ms"] == pytest.approx(0.8)
    assert main["top"] == [{"name": "aten::linear", "calls": 2, "ms": pytest.approx(0.8)}]
    text = ts.format_summary(s)
    assert "busy 2.5 ms (50% of the window)" in text and "1.50 at 1.5" in text


def test_command_reads_a_real_cpu_trace_and_refuses_a_bad_file(tmp_path):
    trace = tmp_path / "trace.json.gz"
    env = dict(os.environ, MASTER_PORT="0")
    made = subprocess.run([sys.executable, os.path.join(SCRIPTS, "trace_steps.py"), "--variant", "zero2_offload",
                           "--layers", "2", "--width", "64", "--heads", "4", "--seq", "32", "--vocab", "256",
                           "--batch", "2", "--warmup", "1", "--steps", "1", "--trace", str(trace)],
                          capture_output=True, text=True, timeout=240, env=env)
    assert made.returncode == 0, made.stderr[-2000:]
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "trace_summary.py"), str(trace), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["gpu"] is None and summary["window_ms"] > 0
    assert any(op["name"] == "aten::linear" or "Backward" in op["name"]
               for thread in summary["threads"] for op in thread["top"])
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(gzip.compress(b"{not json"))
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS, "trace_summary.py"), str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "cannot read" in proc.stderr and "Traceback" not in proc.stderr

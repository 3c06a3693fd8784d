"""scripts/gpu_accept.py (the GPU tier's acceptance run) works before it meets the GPU: its bound rule
and verdicts, and a real tiny run on the CPU in which every (model, variant) gets a row, with
DeepSpeed's cells when DeepSpeed is installed. One cell there is made to raise and another to kill
its process: both show as errors, the cells after them still run, and the exit code is 1."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from scripts import accept_table as table
from scripts.gpu_accept import PLAIN_VARIANTS, VARIANTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = ("llama", "gpt2", "qwen2", "mixtral")
BROKEN = {("gpt2", "zero1"): "raise", ("qwen2", "zero3"): "exit"}


def test_the_bound_is_a_multiple_of_the_self_drift_with_a_floor():
    assert table.loss_bound(0.01) == pytest.approx(table.BOUND_FACTOR * 0.01)
    assert table.loss_bound(0.0) == table.BOUND_FLOOR
    assert table.loss_bound(0.001, recipe_drift=0.02) == pytest.approx(table.BOUND_FACTOR * 0.02)
    assert table.loss_bound(None) is None


def test_the_bound_is_at_least_twice_bf16s_own_error_against_fp32():
    # two sound bf16 runs are each about bf16's error from fp32, so up to twice it apart
    assert table.loss_bound(0.001, fp32_drift=0.03) == pytest.approx(table.FP32_FACTOR * 0.03)
    assert table.loss_bound(0.01, fp32_drift=0.001) == pytest.approx(table.BOUND_FACTOR * 0.01)
    assert table.loss_bound(0.001, fp32_drift=float("nan")) == pytest.approx(table.BOUND_FACTOR * 0.001)
    assert table.loss_bound(None, fp32_drift=0.03) is None   # no self-drift: nothing to judge by
    records = {("m", "plain", "plain"): _record([5.0, 4.0]), ("m", "plain_split", "plain"): _record([5.0, 4.001]),
               ("m", "plain_fp32", "plain"): _record([5.0, 4.02])}
    assert table.self_drift(records, "m")["bound"] == pytest.approx(table.FP32_FACTOR * 0.02)


def _record(losses, ms=10.0, **extra):
    return {"status": "ok", "losses": losses, "step_ms_median": ms, "flops_per_step": 1e12, **extra}


def test_a_cell_over_the_bound_is_red_and_a_known_deepspeed_gap_is_not():
    records = {("m", "plain", "plain"): _record([5.0, 4.0]), ("m", "plain_split", "plain"): _record([5.0, 4.001]),
               ("m", "zero2", "ours"): _record([5.0, 4.1], ms=12.0), ("m", "zero2", "deepspeed"): _record([5.0, 4.0]),
               ("m", "zero0", "ours"): _record([5.0, 4.0]), ("m", "zero0", "deepspeed"): _record([5.0, 4.5])}
    drifts = {"m": table.self_drift(records, "m")}
    assert drifts["m"]["bound"] == pytest.approx(table.BOUND_FACTOR * 1e-3)   # the split moved step 2 by 1e-3
    red = table.judge(records, drifts, "m", "zero2", "ours", peak_tflops=100.0)
    assert red["status"].startswith("red:") and table.is_red(red)
    assert red["time_ratio"] == pytest.approx(1.2) and red["mfu"] == pytest.approx(1e12 / 0.012 / 1e14)
    known = table.judge(records, drifts, "m", "zero0", "ours", peak_tflops=None)
    assert known["status"] == "ok" and "zero.md" in known["note"]
    missing = table.judge(records, drifts, "m", "zero3", "ours", peak_tflops=None)
    assert missing["status"] == "not run" and table.is_red(missing)


def test_cuda_processes_get_an_arch_list_deepspeed_can_parse(monkeypatch):
    """DeepSpeed 0.19.8's op builder fails on torch's '9.0a' (an H100): the run names plain numbers."""
    from scripts import accept_env
    assert accept_env.arch_list([(9, 0), (9, 0)]) == "9.0"
    assert accept_env.arch_list([(8, 0), (9, 0)]) == "8.0;9.0"
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(accept_env, "_capabilities", lambda: [(9, 0)])
    assert accept_env.process_env("cuda")["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert "TORCH_CUDA_ARCH_LIST" not in accept_env.process_env("cpu")
    monkeypatch.setattr(accept_env, "_capabilities", lambda: [])
    assert "TORCH_CUDA_ARCH_LIST" not in accept_env.process_env("cuda")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0+PTX")   # the user's own choice is kept
    assert accept_env.process_env("cuda")["TORCH_CUDA_ARCH_LIST"] == "9.0+PTX"


def test_engine_mfu_is_the_median_after_warm_up():
    lines = ["[zero] progress step=1 loss=5 mfu=1.0%", "[zero] progress step=2 loss=5 mfu=40.0%",
             "[rank 0] [zero] progress step=3 loss=5 tflop/s=1 mfu=42.0%", "noise mfu=9%"]
    assert table.engine_mfu(lines, warmup=1) == pytest.approx(0.41)
    assert table.engine_mfu(["progress step=3 loss=5"], warmup=1) is None


@pytest.mark.timeout(1800)   # ~60 cells in ~12 processes: 194 s alone, over 300 s at load 17
def test_tiny_run_on_cpu_has_every_row_and_shows_broken_cells_red(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    broken = ",".join(f"ours:{m}:{v}={how}" for (m, v), how in BROKEN.items())
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_accept.py"), str(tmp_path), "--tiny",
                           "--device", "cpu", "--cell-timeout", "240", "--break", broken],
                          capture_output=True, text=True, timeout=1500, env=env, cwd=REPO)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {(r["model"], r["variant"], r["engine"]): r
            for r in map(json.loads, (tmp_path / "rows.jsonl").read_text().splitlines())}
    deepspeed = importlib.util.find_spec("deepspeed") is not None
    for model in MODELS:
        for variant in PLAIN_VARIANTS:
            assert rows[(model, variant, "plain")]["status"] == "ok", rows[(model, variant, "plain")]
        for variant in VARIANTS:
            ours = rows[(model, variant, "ours")]
            if (model, variant) in BROKEN:
                assert ours["status"].startswith("error"), ours
                continue
            assert ours["status"] == "ok", ours
            assert ours["vs_plain"] <= ours["bound"]
            theirs = rows[(model, variant, "deepspeed")]["status"]
            assert theirs == "ok" if deepspeed and variant != "zero2_fp16" else theirs.startswith("n/a"), theirs
            if deepspeed and variant != "zero2_fp16":
                assert ours["vs_deepspeed"] is not None
    assert "deliberately broken" in rows[("gpt2", "zero1", "ours")]["reason"]
    assert "exited 9" in rows[("qwen2", "zero3", "ours")]["reason"]
    assert rows[("llama", "trainer_zero3", "ours")]["status"] == "ok"
    assert rows[("llama", "trainer_plain", "plain")]["status"] == "ok"
    table_text = (tmp_path / "accept.md").read_text()
    assert "Bound rule" in table_text and "| qwen2 | zero3_offload | ours | ok |" in table_text
    assert proc.stdout.rstrip().endswith(table_text.rstrip().splitlines()[-1])
    again = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_accept.py"), str(tmp_path),
                            "--report-only"], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert again.returncode == 1, again.stderr[-3000:]   # the broken cells are still red, judged again
    rejudged = (tmp_path / "accept.md").read_text()
    assert "judged again" in rejudged.splitlines()[0]
    assert rejudged.splitlines()[2] == table_text.splitlines()[2]   # the run's commit, card and versions kept


def test_report_only_without_a_run_says_what_it_needs(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gpu_accept.py"), str(tmp_path),
                           "--report-only"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "cells.jsonl" in proc.stderr and "Traceback" not in proc.stderr

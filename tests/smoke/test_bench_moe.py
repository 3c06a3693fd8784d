"""Issue 31 item 5's bench variant on the CPU: the GPT with an MoE layer every other block trains in
plain PyTorch and through our engine from the same weights, and DeepSpeed's twin says why it cannot
run here (on the GPU it trains the same model with DeepSpeed's own MoE layer: bench_moe.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from scripts import bench_engine
from tests.helpers.figures import is_figure

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(bench_engine.__file__)), "bench_engine.py")


def test_moe_gpt_trains_in_plain_and_ours_and_deepspeed_is_unavailable_on_cpu():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, SCRIPT, "--tiny", "--model", "moe", "--peak-size", "0",
                           "--variants", "plain,zero2,ds_zero2"], capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r["variant"]: r for r in map(json.loads, (l for l in proc.stdout.splitlines() if l.startswith("{")))
            if r.get("status")}
    for name in ("plain", "zero2"):
        r = runs[name]
        assert r["status"] == "ok" and (r["model"], r["experts"], r["top_k"]) == ("moe", 8, 2), r.get("reason")
        assert is_figure(r["tokens_per_s"]) and len(r["losses"]) == r["warmup"] + r["steps"]
    # more parameters than the dense tiny GPT (8 experts in one of its two blocks)
    assert runs["plain"]["params_m"] > 0.3
    # same seed, model and data: the first loss agrees (bf16 engine vs fp32 weights under autocast)
    assert runs["zero2"]["losses"][0] == pytest.approx(runs["plain"]["losses"][0], rel=1e-2)
    assert runs["ds_zero2"]["status"] == "unavailable" and "CUDA" in runs["ds_zero2"]["reason"]

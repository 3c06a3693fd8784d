"""scripts/offload_floor.py would have stopped issue 43's regression (0.690x -> 0.645x plain between
6d3c329 and 7878aa9, both on an H100); the A/B variants and the host-buffer bench run on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from scripts import offload_floor
from scripts.bench_variants import VARIANTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H100 = "NVIDIA H100 80GB HBM3"


def _jsonl(tmp_path, device, ratios: dict[str, float]) -> str:
    """A bench_engine.py --repeat 3 output: a run record (the card) and one median row per variant."""
    plain = 140882.0
    lines = [{"variant": "plain", "status": "ok", "device": device}]
    lines += [{"summary": True, "variant": name, "tokens_per_s_median": plain * ratio, "ratio_vs_plain": ratio}
              for name, ratio in {"plain": 1.0, **ratios}.items()]
    path = tmp_path / "offload.jsonl"
    path.write_text("[bench] noise\n" + "\n".join(json.dumps(line) for line in lines) + "\n")
    return str(path)


def test_6d3c329s_figures_hold_and_7878aa9s_fail(tmp_path, capsys):
    before = _jsonl(tmp_path, H100, {"zero2_offload_overlap": 0.690, "zero3_offload_overlap": 0.690})
    assert offload_floor.main([before]) == 0
    after = _jsonl(tmp_path, H100, {"zero2_offload_overlap": 0.644, "zero3_offload_overlap": 0.645})
    assert offload_floor.main([after]) == 1
    out = capsys.readouterr().out
    assert "zero2_offload_overlap: 0.644x plain, floor 0.67: REGRESSED" in out
    assert "zero3_offload_overlap: 0.645x plain, floor 0.67: REGRESSED" in out


def test_the_ab_names_what_the_exact_pages_cost(tmp_path, capsys):
    path = _jsonl(tmp_path, H100, {"zero2_offload_overlap": 0.690, "zero2_offload_overlap_torch_pinned": 0.740,
                                   "zero3_offload_overlap": 0.690})
    assert offload_floor.main([path]) == 1
    line = [x for x in capsys.readouterr().out.splitlines() if "torch's pinned allocator" in x][0]
    # 16 x 1024 tokens: 168.5 ms against 157.2 ms a step
    assert "168.5 ms/step with exact pinned pages, 157.2 with torch's pinned allocator: +11.4 ms" in line
    assert line.endswith("EXACT PAGES COST")


def test_another_card_is_printed_not_judged_and_a_missing_variant_fails(tmp_path, capsys):
    assert offload_floor.main([_jsonl(tmp_path, "NVIDIA H200", {"zero2_offload_overlap": 0.5})]) == 0
    assert "no floors for this card" in capsys.readouterr().out
    assert offload_floor.main([_jsonl(tmp_path, H100, {"zero2_offload_overlap": 0.7})]) == 1
    assert "zero3_offload_overlap: not measured" in capsys.readouterr().out
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert offload_floor.main([str(empty)]) == 2


def test_the_ab_variants_are_the_overlapped_offloads_with_torchs_allocator():
    for stage in (2, 3):
        assert f"zero{stage}_offload_overlap_torch_pinned" in VARIANTS


def test_host_buffer_bench_runs_on_the_cpu():
    env = dict(os.environ, PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench_host_buffers.py"),
                           "--numel", "4096", "--repeat", "1"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert record["kind"] == "torch" and record["adam_ms"] > 0


def test_the_ab_and_bf16_state_variants_train_on_the_cpu(tmp_path):
    """The variants gpu_runs.sh's offload-ab, bf16-states and nvme parts time, on a tiny CPU run: each trains."""
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="", DSLAUNCH_BENCH_NVME=str(tmp_path))
    variants = ("zero2_offload_overlap_torch_pinned,zero3_offload_bf16states,zero2_offload_overlap_bf16states,"
                "zero3_offload_nvme")
    script = os.path.join(REPO, "scripts", "bench_engine.py")
    done = subprocess.run([sys.executable, script, "--tiny", "--peak-size", "0",
                           "--variants", variants], capture_output=True, text=True, env=env, timeout=300)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    status = {r["variant"]: r["status"] for r in records if r.get("variant") in variants.split(",")}
    assert status == dict.fromkeys(variants.split(","), "ok"), done.stderr[-2000:]

"""scripts/gpu_runs.sh keeps naming things that exist: its ``check`` part prints every command of
every part, and each one's script, variants and options must be accepted by that script."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from scripts import bench_capacity, bench_engine
from scripts.bench_variants import VARIANTS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "gpu_runs.sh")


def _commands(tmp_path) -> list[str]:
    proc = subprocess.run(["bash", SCRIPT, "check", str(tmp_path)], capture_output=True, text=True,
                          timeout=30, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return [line.split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("== ")]


def test_every_part_names_real_scripts_and_variants(tmp_path):
    commands = _commands(tmp_path)
    assert any("tests/gpu -m gpu" in c for c in commands)
    benches = [c for c in commands if "scripts/bench_engine.py" in c]
    assert len(benches) >= 6          # the repeats, four thread counts, stages 0-2
    for command in commands:
        for path in re.findall(r"scripts/[\w/]+\.py", command):
            assert os.path.isfile(os.path.join(REPO, path)), path
    for command in benches:
        argv = command.split("scripts/bench_engine.py", 1)[1].split()
        args = bench_engine.parse_args(argv)
        assert set(args.variants.split(",")) <= set(VARIANTS), command
    traced = [m for c in commands for m in re.findall(r"--variant (\w+)", c)]
    assert traced and set(traced) <= set(VARIANTS)
    threads = [int(m) for c in commands for m in re.findall(r"DSLAUNCH_CPU_ADAM_THREADS=(\d+)", c)]
    assert len(threads) >= 3 and len(set(threads)) == len(threads)
    for command in [c for c in commands if "scripts/bench_capacity.py" in c]:
        args = bench_capacity.parse_args(command.split("scripts/bench_capacity.py", 1)[1].split())
        assert set(args.variants.split(",")) <= set(bench_capacity.KNOWN), command


def test_issue_32_parts_cover_its_items(tmp_path):
    """compile variants with DeepSpeed's, offload with bytes/param and traces, the Llama beside
    DeepSpeed with checkpointing, and the capacity of stage 3 with offload."""
    commands = _commands(tmp_path)
    variants = {v for c in commands if "--variants" in c for v in c.split("--variants ")[1].split()[0].split(",")}
    assert {"plain_compile", "zero2_compile", "zero3_compile", "fsdp2_compile", "ds_zero3_compile"} <= variants
    assert any("--model llama" in c and "--grad-ckpt" in c for c in commands)
    assert any("--model llama" in c and "ds_zero3" in c and "zero3_offload_overlap" in c for c in commands)
    assert any("--bytes" in c and "ds_zero3_offload_all" in c for c in commands)
    assert any("zero3_offload_optimizer" in c for c in commands)


def test_issue_31_moe_part_runs_ours_beside_deepspeeds_moe(tmp_path):
    moe = [c for c in _commands(tmp_path) if "--model moe" in c]
    assert moe, "no MoE part"
    args = bench_engine.parse_args(moe[0].split("scripts/bench_engine.py", 1)[1].split())
    assert (args.experts, args.top_k) == (8, 2)
    assert {"plain", "zero2", "ds_zero2"} <= set(args.variants.split(","))


@pytest.mark.parametrize("argv", [["bogus", "/tmp/x"], ["speed"]])
def test_bad_part_or_missing_dir_is_a_usage_error(argv):
    proc = subprocess.run(["bash", SCRIPT, *argv], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert proc.returncode != 0
    assert "usage" in proc.stderr + proc.stdout or "unknown part" in proc.stdout


def test_issue_39_accept_parts_run_the_acceptance_driver_within_the_device_limit(tmp_path):
    from scripts import gpu_accept

    accept = [c for c in _commands(tmp_path) if "scripts/gpu_accept.py" in c]
    assert len(accept) == 2                      # accept, and accept-tests before the GPU tests
    for command in accept:
        args = gpu_accept.parse_args(command.split("scripts/gpu_accept.py", 1)[1].replace("$OUT", "/tmp/x").split())
        assert 0 < args.budget and args.budget + 40 + 30 < 600   # its timeout (budget + 40), setup and pack within 10 min

"""scripts/gpu_runs.sh keeps naming things that exist: its ``check`` part prints every command of
every part, and each one's script, variants and options must be accepted by that script."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from scripts import bench_engine
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


@pytest.mark.parametrize("argv", [["bogus", "/tmp/x"], ["speed"]])
def test_bad_part_or_missing_dir_is_a_usage_error(argv):
    proc = subprocess.run(["bash", SCRIPT, *argv], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert proc.returncode != 0
    assert "usage" in proc.stderr + proc.stdout or "unknown part" in proc.stdout

"""The engine on GPUs through NCCL: parity at stages 0-2 and the example in bf16 and fp16.

Uses up to 2 CUDA GPUs, one rank per GPU (marker ``gpu``); skipped without CUDA.
"""
from pathlib import Path

import pytest

from tests.helpers.world import REPO, check, run_world

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
WORLD = min(2, torch.cuda.device_count())

PARITY = Path(__file__).parents[1] / "dist" / "workers" / "parity_worker.py"


def test_parity_over_nccl():
    for result in check(run_world(PARITY, WORLD, "0,1,2", timeout=300)):
        for record in result.records():
            assert record["max_abs_error"] < 1e-5, record


@pytest.mark.parametrize("config", ["zero2_bf16.json", "zero1_fp16.yaml", "zero0.json"])
def test_example_trains_on_gpus(config):
    results = check(run_world(REPO / "examples" / "train_gpt.py", WORLD, "--config",
                              str(REPO / "examples" / "configs" / config), "--steps", "60", timeout=300))
    summary = [line for line in results[0].stdout.splitlines() if "first loss" in line][0]
    first, last = float(summary.split("first loss ")[1].split()[0]), float(summary.split("val loss ")[1].split()[0])
    assert last < first - 0.5, summary

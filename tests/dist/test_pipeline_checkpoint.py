"""Pipeline checkpoints: save on data 2, resume on data 1 (same global batch), exact against AdamW.

Two steps on pipe 2 x data 2 (gradient accumulation 2), save; then a job of half the ranks (data 1,
accumulation 4) loads it and runs steps 3-4: every weight, loss and clip norm must equal the
single-process run of 4 steps. ``dslaunch-zero-to-fp32``'s state dict at step 2 must equal the
reference's weights (tensor shards joined). Also in 3D: pipe 2 x tensor 2 x data 2 -> data 1, and at
ZeRO stage 1 (each data rank's slice of the optimizer state gathered at save, re-sliced at load).
"""
from pathlib import Path

import pytest

from tests.helpers.world import check, run_world

WORKER = Path(__file__).parent / "workers" / "pipe_worker.py"


def _records(results):
    return [result.records()[0] for result in check(results)]


@pytest.mark.parametrize("model, tensor, world", [("tied", 1, 4), ("tp", 2, 8), ("tied+zero1", 1, 4)])
def test_save_on_data_2_resume_on_data_1(tmp_path, model, tensor, world):
    folder = str(tmp_path / "ckpt")
    saved = _records(run_world(WORKER, world, "2", "1f1b", model, "2", "uniform", str(tensor), "save", folder,
                               timeout=240))
    assert all(r["global_steps"] == 2 and r["max_abs_error"] < 1e-5 for r in saved)
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step2"
    resumed = _records(run_world(WORKER, world // 2, "2", "1f1b", model, "4", "uniform", str(tensor), "resume",
                                 folder, timeout=240))
    for record in resumed:
        assert record["dp"] == 1 and record["global_steps"] == 4
        assert record["max_abs_error"] < 1e-5, record
        assert record["consolidated_error"] < 1e-5, record   # the step-2 weights: same bound as parity
        assert len(record["losses"]) == 2
        for (loss, norm), (ref_loss, ref_norm) in zip(record["losses"], record["reference_losses"]):
            assert abs(loss - ref_loss) < 1e-5 and abs(norm - ref_norm) < 1e-5, record

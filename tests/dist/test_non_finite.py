"""A planted inf names its layer and step once for the job, through the real launcher on 2 ranks."""
import json
import os

import pytest

from tests.helpers.world import REPO, run_world

WORKER = os.path.join(REPO, "tests", "dist", "workers", "nan_worker.py")
BASE = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def run(tmp_path, config, layer, step, bad_rank, steps=5):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({**BASE, **config}))
    return run_world(WORKER, 2, str(path), layer, str(step), str(steps), str(bad_rank), timeout=300)


@pytest.mark.parametrize("stage,precision", [(0, {}), (2, {"bf16": {"enabled": True}})])
def test_a_planted_inf_is_named_by_layer_and_step_once_and_the_job_trains_on(tmp_path, stage, precision):
    results = run(tmp_path, {"zero_optimization": {"stage": stage}, **precision}, "blocks.1.fc", 3, bad_rank=1)
    assert all(r.returncode == 0 for r in results), results[0].stderr + results[1].stderr
    everything = "".join(r.stdout + r.stderr for r in results)
    assert everything.count("non-finite gradients at step 3:") == 1, everything
    said = results[0].stderr
    assert "the loss itself was non-finite" in said, said
    assert "first non-finite output in forward order: blocks.1.fc (Linear) on rank 1" in said, said
    assert "last finite loss: " in said and " at step 2" in said, said
    assert [r.records()[0]["skipped"] for r in results] == [1, 1]
    assert [r.records()[0]["steps"] for r in results] == [5, 5]


def test_stop_ends_the_job_with_exit_code_65_and_the_diagnosis_once(tmp_path):
    results = run(tmp_path, {"zero_optimization": {"stage": 1}, "non_finite": {"action": "stop"}},
                  "blocks.0.attn.qkv", 2, bad_rank=-1)
    assert results[0].returncode == 65, results[0].stderr
    said = results[0].stderr
    assert said.count("dslaunch: non-finite training: non-finite gradients at step 2:") == 1, said
    assert "first non-finite output in forward order: blocks.0.attn.qkv (Linear) on rank 0" in said, said
    assert "Traceback" not in said and all(not r.records() for r in results)


FP16_AT_MIN = {"enabled": True, "initial_scale_power": 0, "min_loss_scale": 1, "hysteresis": 1}


def test_fp16_with_zero_stops_at_the_first_overflow_at_the_minimum_scale_with_deepspeeds_message(tmp_path):
    results = run(tmp_path, {"zero_optimization": {"stage": 1}, "fp16": FP16_AT_MIN}, "blocks.0.fc", 2, bad_rank=0)
    said = results[0].stderr
    assert results[0].returncode == 65, said
    assert said.count("Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.") == 1, said
    assert "first non-finite output in forward order: blocks.0.fc (Linear) on rank 0" in said, said


def test_fp16_without_zero_stops_after_stuck_scale_steps_overflows_in_a_row(tmp_path):
    config = {"zero_optimization": {"stage": 0}, "fp16": FP16_AT_MIN, "non_finite": {"stuck_scale_steps": 2}}
    results = run(tmp_path, config, "blocks.1.attn.proj", "2:3", bad_rank=1)
    said = results[0].stderr
    assert results[0].returncode == 65, said
    assert "(fp16: 2 overflowing steps in a row at min_loss_scale 1)" in said, said
    assert "first non-finite output in forward order: blocks.1.attn.proj (Linear) on rank 1" in said, said
    assert said.count("non-finite gradients at step 3:") == 1, said    # the step that stops, its batch re-run
    assert "last finite loss: " in said and " at step 1 (mean over ranks)" in said, said

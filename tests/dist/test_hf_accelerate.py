"""An Accelerate script with a DeepSpeed plugin runs unchanged under ``dslaunch --as-deepspeed`` (issue 30).

tests/scripts/hf/train_accelerate.py (``Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=...))``,
``accelerator.prepare``, ``accelerator.backward``, ``save_state``/``load_state``, ``get_state_dict`` and
``save_pretrained``) is replayed exactly as recorded under a real DeepSpeed 0.19.8 (2 CPU ranks, fp32).
"""
from __future__ import annotations

import pytest

from tests.helpers.recorded import FP32_TOLERANCE, assert_losses_match, recorded, replay, straight_run
from tests.scripts.hf.tiny_data import StrideTokens, mean_loss

STAGES = [0, 1, 2, 3]
RESUME_STAGES = [3]   # partitioned parameters, the hardest to restore; the Trainer's resume covers stage 0


@pytest.fixture(scope="module", params=STAGES, ids=lambda stage: f"zero{stage}")
def straight(request, tmp_path_factory):
    return (request.param, *straight_run(f"accelerate_zero{request.param}", tmp_path_factory))


def test_every_step_loss_and_the_eval_loss_match_deepspeed(straight):
    stage, _, ours, theirs = straight
    assert ours["world_size"] == 2 and ours["zero_stage"] == stage
    assert_losses_match(ours, theirs)
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], abs=FP32_TOLERANCE)


def test_get_state_dict_and_save_pretrained_write_a_model_from_pretrained_loads(straight):
    from transformers import LlamaForCausalLM

    _, folder, ours, _ = straight
    model = LlamaForCausalLM.from_pretrained(folder / "run")
    assert mean_loss(model.eval(), StrideTokens(32, seed=1235), batch_size=8) == pytest.approx(ours["eval_loss"], abs=1e-5)


@pytest.mark.parametrize("stage", RESUME_STAGES, ids=lambda stage: f"zero{stage}")
def test_save_state_then_load_state_continues_with_the_uninterrupted_losses(stage, tmp_path):
    theirs = recorded(f"accelerate_zero{stage}")["runs"][0]["report"]
    interrupted, resumed = replay(f"accelerate_zero{stage}_resume", tmp_path)
    assert [s["step"] for s in interrupted["steps"]] == [1, 2, 3, 4, 5]
    assert [s["step"] for s in resumed["steps"]] == [6, 7, 8, 9, 10]
    assert_losses_match(resumed, {"steps": [s for s in theirs["steps"] if s["step"] > 5]})
    assert resumed["eval_loss"] == pytest.approx(theirs["eval_loss"], abs=FP32_TOLERANCE)

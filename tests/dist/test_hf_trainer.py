"""A Hugging Face Trainer script runs unchanged under ``dslaunch --as-deepspeed`` with DeepSpeed's losses (issue 30).

tests/scripts/hf/train_clm.py (run_clm-style: HfArgumentParser, TrainingArguments, a tiny Llama from a
config, ``Trainer.train()``, ``save_model()``, ``evaluate()``, ``--deepspeed`` with the HF docs' "auto"
configs) is replayed exactly as it was recorded under a real DeepSpeed 0.19.8 (2 CPU ranks, fp32) and
compared step by step.
"""
from __future__ import annotations

import pytest

from tests.helpers.recorded import FP32_TOLERANCE, assert_losses_match, losses_by_step, recorded, replay, straight_run
from tests.scripts.hf.tiny_data import StrideTokens, mean_loss

STAGES = [0, 1, 2, 3]
# resume is checked where the state differs most: whole on every rank (0) and partitioned parameters (3);
# stages 1 and 2 save and load through the same fragment format as stage 0 (tests/dist/test_*checkpoint*)
RESUME_STAGES = [0, 3]
EVAL_SAMPLES, EVAL_SEED, EVAL_BATCH = 32, 1235, 8   # train_clm.py's defaults and the recorded --per_device_eval_batch_size


@pytest.fixture(scope="module", params=STAGES, ids=lambda stage: f"zero{stage}")
def straight(request, tmp_path_factory):
    """One uninterrupted run at a ZeRO stage: (stage, its folder, our report, DeepSpeed's report)."""
    return (request.param, *straight_run(f"trainer_zero{request.param}", tmp_path_factory))


def test_every_step_loss_and_the_eval_loss_match_deepspeed(straight):
    _, _, ours, theirs = straight
    assert ours["world_size"] == 2 and ours["global_step"] == 10
    assert_losses_match(ours, theirs)
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], abs=FP32_TOLERANCE)


def test_save_model_writes_a_model_from_pretrained_loads(straight):
    """The saved model, loaded without DeepSpeed, scores the eval data as ``evaluate()`` did at the end."""
    from transformers import LlamaForCausalLM

    _, folder, ours, _ = straight
    model = LlamaForCausalLM.from_pretrained(folder / "run")
    loss = mean_loss(model.eval(), StrideTokens(EVAL_SAMPLES, seed=EVAL_SEED), batch_size=EVAL_BATCH)
    assert loss == pytest.approx(ours["eval_loss"], abs=1e-5)


def test_at_zero3_from_pretrained_under_the_deepspeed_config_builds_partitioned(straight):
    stage, _, ours, theirs = straight
    if stage != 3:
        pytest.skip("zero.Init partitions only at ZeRO-3")
    built, reference = ours["from_pretrained_under_zero3"], theirs["from_pretrained_under_zero3"]
    assert built["every_param_partitioned"] and built["gathered_equals_saved"]
    assert built["full_numel"] == reference["full_numel"]
    assert built["local_numel"] < built["full_numel"] / 2   # DeepSpeed's: 0 (every element on its shard)


@pytest.mark.parametrize("stage", RESUME_STAGES, ids=lambda stage: f"zero{stage}")
def test_resume_from_checkpoint_continues_with_the_uninterrupted_losses(stage, tmp_path):
    """Stopped after step 5's checkpoint, then ``resume_from_checkpoint=True``: steps 6-10 as if never stopped."""
    interrupted, resumed = replay(f"trainer_zero{stage}_resume", tmp_path)
    assert (tmp_path / "run" / "checkpoint-5").is_dir()
    assert max(losses_by_step(interrupted)) == 5 and resumed["global_step"] == 10
    uninterrupted = recorded(f"trainer_zero{stage}")["runs"][0]["report"]
    assert_losses_match(resumed, uninterrupted, steps=range(6, 11))
    assert resumed["eval_loss"] == pytest.approx(uninterrupted["eval_loss"], abs=FP32_TOLERANCE)

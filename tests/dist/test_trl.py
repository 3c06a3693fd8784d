"""TRL's trainers with ``--deepspeed``, unchanged under ``dslaunch --as-deepspeed`` (issue 41).

tests/scripts/frameworks/trl_train.py gives ``SFTTrainer`` / ``DPOTrainer`` a model name (a tiny Llama
and its tokenizer saved first): TRL loads the model (under ``zero.Init`` at ZeRO-3), and DPO loads its
reference model too and wraps it with ``trl.models.prepare_deepspeed``: ``deepspeed.initialize`` without
an optimizer. Replayed as recorded under a real DeepSpeed 0.19.8 (2 CPU ranks, fp32, 6 steps of 2
micro-batches of 4). At ZeRO-3 TRL's fused LM head saves ``lm_head.weight`` in its own autograd Function
and reads ``ds_status`` in backward (stage3/coordinator.py says how the parameter comes back as itself).
"""
from __future__ import annotations

import pytest

from tests.helpers.recorded import assert_losses_match, straight_run


@pytest.mark.parametrize("stage", [0, 1, 2], ids=lambda stage: f"zero{stage}")
def test_sft_trains_with_deepspeeds_losses(stage, tmp_path_factory):
    _, ours, theirs = straight_run(f"trl_sft_zero{stage}", tmp_path_factory)
    assert ours["world_size"] == 2 and ours["global_step"] == 6
    assert_losses_match(ours, theirs)


def test_dpo_with_its_reference_engine_trains_with_deepspeeds_losses_and_margins(tmp_path_factory):
    """ZeRO-2 training; the reference model an optimizer-less stage-0 engine, as DeepSpeed builds it."""
    _, ours, theirs = straight_run("trl_dpo_zero2", tmp_path_factory)
    assert ours["ref_engine_class"] == "ZeroEngine"
    assert_losses_match(ours, theirs)
    assert [s["margin"] for s in ours["steps"]] == pytest.approx([s["margin"] for s in theirs["steps"]], abs=1e-5)


@pytest.mark.parametrize("trainer", ["sft", "dpo"])
def test_at_zero3_trains_with_deepspeeds_losses(trainer, tmp_path_factory):
    _, ours, theirs = straight_run(f"trl_{trainer}_zero3", tmp_path_factory)
    assert_losses_match(ours, theirs)

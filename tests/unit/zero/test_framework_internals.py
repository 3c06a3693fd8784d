"""What frameworks that drive DeepSpeed read beyond its documented API (issue 41), on one rank.

TRL's ``prepare_deepspeed`` writes nested keys as dotted top-level ones; its fused LM head reads
``param.ds_status`` of every parameter at ZeRO-3; its ``unwrap_model_for_generation`` takes DeepSpeed
stage 3's hooks apart through the optimizer. Training through them is tests/dist/test_trl.py.
"""
import pytest
import torch

from launcher.zero.config.load import load_config, no_effect_notes
from launcher.zero.errors import ConfigError


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_a_dotted_top_level_key_naming_a_nested_one_loads_with_a_note_and_changes_nothing():
    """DeepSpeed reads no key with dots and ignores it; a silent accept would hide it, a refusal stop TRL."""
    config = load_config({"train_batch_size": 8, "zero_optimization": {"stage": 3},
                          "zero_optimization.reduce_bucket_size": 1024})
    assert config.zero_optimization.reduce_bucket_size == load_config({"train_batch_size": 8}).zero_optimization.reduce_bucket_size
    assert any("'zero_optimization.reduce_bucket_size' is a top-level key with dots" in note
               for note in no_effect_notes(config))


@pytest.mark.parametrize("key", ["zero_optimization.reduce_bucket_sise", "zero_optimization.stage.x", "zero.stage"])
def test_a_dotted_key_that_names_no_nested_key_is_still_refused(key):
    with pytest.raises(ConfigError, match=f"unknown config key '{key}'"):
        load_config({"train_batch_size": 8, key: 1})

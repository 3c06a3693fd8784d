"""What frameworks that drive DeepSpeed read beyond its documented API (issue 41), on one rank.

TRL's ``prepare_deepspeed`` writes nested keys as dotted top-level ones; its fused LM head reads
``param.ds_status`` of every parameter at ZeRO-3; its ``unwrap_model_for_generation`` takes DeepSpeed
stage 3's hooks apart through the optimizer. Training through them is tests/dist/test_trl.py.
"""
import pytest
import torch

from launcher import zero
from launcher.zero.config.load import load_config, no_effect_notes
from launcher.zero.errors import ConfigError, NotSupportedError
from launcher.zero.zero.partition_parameters import ZeroParamStatus


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


def build(stage: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 2))   # 4160 and 130 elements
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 1000}}
    engine, optimizer, _, _ = zero.initialize(model=model, config=config)
    return engine, optimizer


def test_at_zero3_every_parameter_carries_deepspeeds_status_persistent_ones_available():
    engine, _ = build(3)
    big, big_bias, small, small_bias = engine.module.parameters()
    assert big.ds_status == ZeroParamStatus.NOT_AVAILABLE and not getattr(big, "ds_persist", False)
    for whole in (big_bias, small, small_bias):     # under the persistence threshold: kept whole on every rank
        assert whole.ds_persist and whole.ds_status == ZeroParamStatus.AVAILABLE
        assert whole.ds_numel == whole.numel() and whole.ds_shape == whole.shape


def test_stage3s_hook_internals_are_named_as_not_supported_other_attributes_stay_absent():
    _, optimizer = build(3)
    with pytest.raises(NotSupportedError, match="optimizer.parameter_offload: DeepSpeed ZeRO-3's") as error:
        optimizer.parameter_offload
    assert "ds3_gather_for_generation=False" in error.value.hint
    assert not hasattr(optimizer, "no_such_thing")


def test_below_stage3_the_hook_internals_are_plainly_absent_as_in_deepspeed():
    _, optimizer = build(2)
    assert not hasattr(optimizer, "parameter_offload")


@pytest.mark.parametrize("stage", [1, 3])
def test_offload_states_and_reload_states_are_named_as_not_supported(stage):
    _, optimizer = build(stage)
    for name in ("offload_states", "reload_states"):
        with pytest.raises(NotSupportedError, match=f"optimizer.{name}: moving the optimizer's states"):
            getattr(optimizer, name)()

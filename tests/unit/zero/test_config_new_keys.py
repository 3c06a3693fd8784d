"""DeepSpeed 0.16-0.19's config keys (issue 41 item 3): each does what DeepSpeed does, or the config
is refused when it loads, by a ConfigError that names the key and says what to use instead.

No key of this list may load and change nothing: the refusals below used to load (with at most a
"has no effect" note), or failed as an unknown key without saying what the key is.
"""
import pytest

from launcher.zero.config.load import load_config, no_effect_notes
from launcher.zero.errors import ConfigError

BASE = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def with_zero(stage=3, **zero):
    return {"zero_optimization": {"stage": stage, **zero}}


def offload(**keys):
    return with_zero(3, offload_optimizer={"device": "cpu", **keys})


# (config, the key path the message names, a word the hint must hold)
REFUSED = {
    "torch_autocast": ({"torch_autocast": {"enabled": True, "dtype": "bfloat16"}}, "torch_autocast.enabled", "bf16"),
    "deepcompile": ({"compile": {"deepcompile": True}}, "compile.deepcompile", "torch.compile"),
    "zenflow": (with_zero(2, zenflow={"topk_ratio": 0.1, "update_interval": 4}), "zero_optimization.zenflow",
                "offload_optimizer"),
    "super_offload": (offload(super_offload=True), "zero_optimization.offload_optimizer.super_offload",
                      "offload_optimizer"),
    "sequence_parallel_size": ({"sequence_parallel_size": 2}, "sequence_parallel_size", "sequence_parallel_size"),
    "zero_quantized_weights": (with_zero(3, zero_quantized_weights=True), "zero_optimization.zero_quantized_weights",
                               "remove"),
    "zero_quantized_nontrainable_weights": (with_zero(3, zero_quantized_nontrainable_weights=True),
                                            "zero_optimization.zero_quantized_nontrainable_weights", "remove"),
    "zero_quantized_gradients": (with_zero(3, zero_quantized_gradients=True),
                                 "zero_optimization.zero_quantized_gradients", "communication_data_type"),
    "zero_hpz_partition_size": (with_zero(3, zero_hpz_partition_size=8), "zero_optimization.zero_hpz_partition_size",
                                "remove"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_deepspeed_key_not_built_is_refused_by_name_with_what_to_use(name):
    extra, key, hint_word = REFUSED[name]
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE, **extra})
    assert f"{key} " in caught.value.message and "not built in dslaunch's engine" in caught.value.message
    assert caught.value.hint and hint_word in caught.value.hint
    assert caught.value.kind == "config error" and caught.value.exit_code == 2


@pytest.mark.parametrize("name", ["zenflow", "super_offload"])
def test_zenflow_and_superoffload_point_at_partial_offload_and_promise_nothing(name):
    """Issue 43 reached its offload speed with offload_optimizer.ratio (exact Adam) and left these two
    unbuilt: the refusal names the knob that is built, and no issue that would build them."""
    extra, _, _ = REFUSED[name]
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE, **extra})
    assert "issue" not in caught.value.message and '"ratio": 0.3' in caught.value.hint


@pytest.mark.parametrize("zero, words", [
    (with_zero(3, offload_optimizer={"device": "nvme", "nvme_path": "/tmp", "ratio": 0.5}), ["with device 'nvme'"]),
])
def test_partial_offload_where_it_is_not_built_is_refused_by_name(zero, words):
    with pytest.raises(ConfigError) as caught:
        load_config({**BASE, **zero})
    assert "zero_optimization.offload_optimizer.ratio " in caught.value.message
    assert all(word in caught.value.message for word in words), caught.value.message
    assert "not built" in caught.value.message or "only" in caught.value.message
    assert caught.value.hint and "ratio" in caught.value.hint and caught.value.exit_code == 2


# values that are DeepSpeed's defaults (or do nothing in DeepSpeed either) load, with no note
ACCEPTED = {
    "zero_hpz_partition_size 1": with_zero(3, zero_hpz_partition_size=1),
    "quantized false": with_zero(3, zero_quantized_weights=False, zero_quantized_gradients=False),
    "sequence_parallel_size 1": {"sequence_parallel_size": 1},
    "zenflow null": with_zero(2, zenflow=None),
    "super_offload false": offload(super_offload=False, cpuadam_cores_perc=0.5),
    "ratio 1": offload(ratio=1.0),
    "ratio 0.3 at stage 3": offload(ratio=0.3),   # built (issue 43): 0.7 of the sub-groups stay on the device
    # built at stages 1-2 too (DeepSpeed 0.19.8 refuses these): the same rule over each rank's partition
    "ratio 0.3 at stage 2": with_zero(2, offload_optimizer={"device": "cpu", "ratio": 0.3}),
    "ratio 0.0 at stage 1": with_zero(1, offload_optimizer={"device": "cpu", "ratio": 0.0}),
    "torch_autocast off": {"torch_autocast": {"enabled": False, "dtype": "bfloat16"}},
    "bf16 states off": {"bf16": {"enabled": True, "bf16_master_weights_and_grads": False,
                                 "bf16_optimizer_states": False}},
    "deepcompile off": {"compile": {"deepcompile": False}},
    "bf16 masters with offload": {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True},
                                  **offload()},
    "bf16 masters and states": {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True,
                                         "bf16_optimizer_states": True}, **with_zero(2)},
}


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_the_defaults_of_those_keys_load_without_a_note(name):
    loaded = load_config({**BASE, **ACCEPTED[name]})
    assert no_effect_notes(loaded) == []


@pytest.mark.parametrize("bad, key", [
    ({"sequence_parallel_size": 0}, "sequence_parallel_size: must be >= 1"),
    ({"torch_autocast": {"enabled": "yes"}}, "torch_autocast.enabled: expected true or false"),
    ({"torch_autocast": {"enable": True}}, "unknown config key 'torch_autocast.enable'"),
    (offload(super_offload=1), "super_offload: expected true or false"),
    (offload(cpuadam_cores_perc=1.5), "cpuadam_cores_perc: must be <= 1.0"),
    (with_zero(2, zenflow=[1]), "zero_optimization.zenflow: expected a mapping"),
])
def test_those_keys_are_type_checked_like_every_key(bad, key):
    with pytest.raises(ConfigError, match=key):
        load_config({**BASE, **bad})


def muon(params=None, **sections):
    return load_config({**BASE, "optimizer": {"type": "Muon", "params": params or {"lr": 0.02}}, **sections})


def test_the_muon_optimizer_type_is_taken_with_its_muon_lr_adam_lr_split():
    from launcher.zero.config.checks import check_without_model

    check_without_model(muon({"muon_lr": 0.02, "adam_lr": 3e-4, "momentum": 0.9, "betas": [0.9, 0.95],
                              "eps": 1e-10, "weight_decay": 0.01, "ns_method": "standard"}))
    check_without_model(muon(zero_optimization={"stage": 3, "reduce_scatter": False}))   # as DeepSpeed 0.19


@pytest.mark.parametrize("config, message", [
    (lambda: muon({"ns_steps": 7}), "'ns_steps' is not taken"),
    (lambda: muon({"per_head_muon": True}), "'per_head_muon' is not taken"),
    (lambda: muon({"muon_learning_rate": 0.1}), "takes no argument 'muon_learning_rate'"),
    (lambda: muon({"ns_method": "svd"}), "ns_method: 'svd'"),
    (lambda: muon(zero_optimization={"stage": 3}), "stage 3 needs zero_optimization.reduce_scatter false"),
    (lambda: muon(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}}), "offload_optimizer"),
    (lambda: muon(bf16={"enabled": True}), "only fp32"),
])
def test_what_muon_does_not_build_is_refused_by_name_before_any_rank_starts(config, message):
    from launcher.zero.config.checks import check_without_model

    with pytest.raises(ConfigError, match=message):
        check_without_model(config())


def test_tensor_parallel_autotp_size_without_a_tensor_split_model_is_refused_at_initialize():
    """DeepSpeed's AutoTP slices the model itself; this engine takes a model already split (mpu=)."""
    import torch

    from launcher import zero

    try:
        with pytest.raises(ConfigError, match="tensor_parallel.autotp_size is 2") as caught:
            zero.initialize(model=torch.nn.Linear(2, 2), config={**BASE, "tensor_parallel": {"autotp_size": 2}})
        assert "mpu=" in caught.value.hint
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_the_reference_page_lists_every_refusal_with_its_message():
    from pathlib import Path

    from launcher.zero.config.not_built import NOT_BUILT

    page = (Path(__file__).resolve().parents[3] / "docs" / "reference" / "config.md").read_text()
    missing = [entry.key for entry in NOT_BUILT if f"`{entry.message(entry.example)}`" not in page]
    assert missing == []

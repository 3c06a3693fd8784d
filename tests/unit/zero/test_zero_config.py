"""Config loading: DeepSpeed keys and defaults, the batch rule, "auto", typed errors."""
import json
import subprocess
import sys

import pytest

from launcher.errors import ConfigError as LauncherConfigError
from launcher.zero.config.load import load_config, no_effect_notes, resolve_batch
from launcher.zero.errors import ConfigError


def test_defaults_match_deepspeed_0_19_8():
    c = load_config({"train_batch_size": 8})
    assert c.gradient_clipping == 1.0 and c.steps_per_print is None and c.wall_clock_breakdown is False
    assert c.zero_optimization.stage == 0 and c.zero_optimization.reduce_bucket_size == 500_000_000
    assert c.zero_optimization.contiguous_gradients is True and c.overlap_comm is False
    assert c.zero_optimization.stage3_prefetch_bucket_size == 50_000_000
    assert c.fp16.initial_scale_power == 16 and c.fp16.loss_scale_window == 1000 and c.fp16.hysteresis == 2
    assert c.fp16.min_loss_scale == 1 and c.fp16.dynamic and c.bf16.check_grad_overflow is True
    assert load_config({"train_batch_size": 8, "zero_optimization": {"stage": 3}}).overlap_comm is True


@pytest.mark.parametrize("given,world_size,expected", [
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4, (32, 4, 2)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
    ({"train_batch_size": 32}, 4, (32, 8, 1)),
    ({"train_micro_batch_size_per_gpu": 4}, 3, (12, 4, 1)),
    ({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 2, (12, 2, 3)),
])
def test_batch_triplet(given, world_size, expected):
    c = load_config(given, world_size=world_size)
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == expected


@pytest.mark.parametrize("given,world_size,match", [
    ({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3}, 2, "train_batch_size \\(10\\) is not equal"),
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, "not equal"),
    ({"gradient_accumulation_steps": 2}, 2, "neither train_batch_size"),
    ({"train_batch_size": "auto"}, 2, "'auto' cannot be resolved for train_batch_size"),
])
def test_batch_errors(given, world_size, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_config(given, world_size=world_size)
    assert info.value.hint


@pytest.mark.parametrize("given,match,hint", [
    ({"zero_optimisation": {}}, "unknown config key 'zero_optimisation'", "zero_optimization"),
    ({"zero_optimization": {"stagee": 1}}, "zero_optimization.stagee", "zero_optimization.stage"),
    ({"fp16": {"enabled": "yes"}}, "fp16.enabled: expected true or false", None),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage", "0, 1, 2, 3"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "both true", None),
    ({"zero_optimization": {"offload_param": {"device": "cpu"}}}, "offload_param needs stage 3", None),
    ({"fp16": {"loss_scale": -1}}, "fp16.loss_scale: must be >= 0", None),
    ({"fp16": {"min_loss_scale": 0}}, "fp16.min_loss_scale: must be > 0", None),
    ({"communication_data_type": "fp8"}, "communication_data_type", "fp32"),
    ({"optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}}}, "max_grad_norm", "gradient_clipping"),
    ({"optimizer": {"type": "Adam", "parms": {}}}, "optimizer.parms", "optimizer.params"),
    ({"train_batch_size": 2.5}, "whole number", None),
])
def test_key_errors_name_the_key(given, match, hint):
    with pytest.raises(ConfigError, match=match) as info:
        load_config({"train_batch_size": 8, **given})
    assert isinstance(info.value, LauncherConfigError)  # the CLI's error boundary maps it to exit 2
    if hint:
        assert hint in info.value.hint


def test_auto_in_sections_falls_back_to_defaults():
    c = load_config({"train_batch_size": 8, "gradient_clipping": "auto", "zero_optimization": {"reduce_bucket_size": "auto"},
                     "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.1}}})
    assert c.gradient_clipping == 1.0 and c.zero_optimization.reduce_bucket_size == 500_000_000
    assert c.optimizer.params == {"weight_decay": 0.1}


def test_aliases_and_legacy_forms():
    c = load_config({"train_batch_size": 8, "bfloat16": {"enabled": True},
                     "zero_optimization": {"stage": 3, "prefetch_bucket_size": 7, "cpu_offload": True}})
    assert c.bf16.enabled and c.zero_optimization.stage3_prefetch_bucket_size == 7
    assert c.zero_optimization.offload_optimizer.device == "cpu"
    assert load_config({"train_batch_size": 8, "zero_optimization": True}).zero_stage == 1
    assert "comms_logger" in load_config({"train_batch_size": 8, "comms_logger": {"enabled": False}}).unsupported
    assert load_config({"train_batch_size": 8, "flops_profiler": {"enabled": True}}).flops_profiler.enabled


@pytest.mark.parametrize("zero, expected", [
    ({"stage": 3, "offload_optimizer": {"device": "cpu"}}, []),                   # ratio 1.0: all offloaded
    ({"stage": 3, "offload_optimizer": {"device": "none", "ratio": 0.3}}, []),    # no offload: nothing to split
])
def test_settings_that_load_but_change_nothing_are_named(zero, expected):
    notes = no_effect_notes(load_config({"train_batch_size": 8, "zero_optimization": zero,
                                         "comms_logger": {"enabled": False}}))
    assert notes[0] == "config section 'comms_logger' is accepted but has no effect in this engine"
    assert len(notes) == 1 + len(expected)
    assert all(text in note for text, note in zip(expected, notes[1:]))


def test_json_and_yaml_files(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 2}}))
    (tmp_path / "c.yaml").write_text("train_micro_batch_size_per_gpu: 2\nzero_optimization:\n  stage: 1\n")
    assert load_config(str(tmp_path / "c.json"), world_size=2).train_micro_batch_size_per_gpu == 4
    assert load_config(tmp_path / "c.yaml", world_size=2).zero_stage == 1
    (tmp_path / "bad.json").write_text('{"train_batch_size": 8,}')
    with pytest.raises(ConfigError, match="bad.json:1: not valid JSON"):
        load_config(str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.json"))


def test_values_deepspeed_accepts_load_here():
    """accelerate's DeepSpeed plugin sets steps_per_print to inf (DeepSpeed then never prints)."""
    config = load_config({"train_batch_size": 8, "steps_per_print": float("inf")})
    assert config.steps_per_print is None
    assert load_config({"train_batch_size": 8, "steps_per_print": 5}).steps_per_print == 5
    with pytest.raises(ConfigError, match="gradient_clipping: must be a finite number"):
        load_config({"train_batch_size": 8, "gradient_clipping": float("inf")})


@pytest.mark.parametrize("passed_to", ["initialize", "zero.Init"])
def test_a_config_error_names_its_source_and_the_key(tmp_path, passed_to):
    with pytest.raises(ConfigError, match=f"^config dict passed to {passed_to}: steps_per_print: must be >= 1"):
        load_config({"train_batch_size": 8, "steps_per_print": 0}, passed_to=passed_to)
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stgae": 2}}))
    with pytest.raises(ConfigError, match=f"^{path}: unknown config key 'zero_optimization.stgae'"):
        load_config(path, passed_to=passed_to)
    path.write_text(json.dumps({"train_batch_size": 8}))
    with pytest.raises(ConfigError, match=f"^{path}: train_batch_size \\(8\\) is not equal"):
        load_config(path, world_size=3)


def test_resolve_batch_is_pure():
    c = load_config({"train_micro_batch_size_per_gpu": 2})
    assert c.train_batch_size is None and resolve_batch(c, 3).train_batch_size == 6


def test_import_is_torch_free():
    code = "import sys, launcher.zero.config.load, launcher.zero; launcher.zero.load_config({'train_batch_size': 2}); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_progress_line_is_one_parsable_line_with_total_eta_and_rates():
    from launcher.zero.engine.monitor import progress_line
    line = progress_line(20, 150, {"loss": 2.8756, "lr": "1.0000e-03", "loss_scale": 1.0, "skipped": 0}, 123.4, 64, 5.1)
    assert line == ("progress step=20/150 loss=2.8756 lr=1.0000e-03 loss_scale=1 skipped=0 samples/s=123.4 "
                    "tokens/s=7898 elapsed=5s eta=33s")
    assert progress_line(7, None, {"loss": None}, 2.0, None, 3725.0) == "progress step=7 samples/s=2.0 elapsed=1h02m"


def test_nvme_optimizer_offload_is_built_and_names_the_aio_keys():
    from launcher.zero.config.load import load_config, no_effect_notes

    cfg = load_config({"train_batch_size": 2, "aio": {"block_size": 1048576, "use_gds": False},
                       "zero_optimization": {
                           "stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"},
                           "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}})
    notes = no_effect_notes(cfg)
    assert not [note for note in notes if "'nvme'" in note or "not built" in note]   # both are built
    aio = [note for note in notes if "'aio'" in note]
    assert len(aio) == 1 and "(block_size, use_gds)" in aio[0] and "no effect" not in aio[0]
    assert cfg.zero_optimization.offload_optimizer_active   # what the estimator and the placement read


def test_every_accepted_key_without_effect_is_named_once_and_defaults_are_not():
    from launcher.zero.config.load import load_config, no_effect_notes

    cfg = load_config({"train_batch_size": 2, "sparse_gradients": True,
                       "zero_optimization": {"stage": 2, "legacy_stage1": True, "memory_efficient_linear": True},
                       "bf16": {"enabled": True, "immediate_grad_update": True}})
    notes = no_effect_notes(cfg)
    named = sorted(note.split("'")[1] for note in notes if note.startswith("config key"))
    assert named == ["bf16.immediate_grad_update", "sparse_gradients", "zero_optimization.legacy_stage1"]
    assert len(notes) == len(set(notes))
    assert no_effect_notes(load_config({"train_batch_size": 2})) == []

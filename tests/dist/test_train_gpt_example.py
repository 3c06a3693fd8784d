"""The README's example script as a new user runs it: dslaunch's --config reaches it."""
import json
import os

import pytest

from tests.helpers.world import REPO, check, run_world

SCRIPT = REPO / "examples" / "train_gpt.py"
ZERO1 = str(REPO / "examples" / "configs" / "zero1.json")


def summary(results):
    return next(line for line in results[0].stdout.splitlines() if line.startswith("[train_gpt] world_size="))


def test_dslaunch_config_is_the_config_the_example_trains_with():
    results = check(run_world(SCRIPT, 2, "--steps", "2", launcher_args=("--config", ZERO1)))
    assert "stage=1" in summary(results)


def test_two_different_configs_are_refused_not_one_silently_ignored():
    results = run_world(SCRIPT, 2, "--steps", "2", "--config", str(REPO / "examples" / "configs" / "zero2.json"),
                        launcher_args=("--config", ZERO1))
    assert results[0].returncode == 2
    assert "two configs: dslaunch --config" in results[0].stderr and "Traceback" not in results[0].stderr


def test_a_ready_line_first_then_parsable_progress_lines(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 2,
                                  "zero_optimization": {"stage": 2},
                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))
    results = check(run_world(SCRIPT, 2, "--steps", "4", "--block_size", "16", launcher_args=("--config", str(config))))
    lines = [line for line in results[0].stdout.splitlines() if line.startswith("[zero] ")]
    assert lines[0].startswith("[zero] ready stage=2 precision=fp32 world_size=2 params=")
    assert "memory_per_rank_mib=" in lines[0]
    progress = [dict(t.split("=", 1) for t in line.split()[2:]) for line in lines if line.startswith("[zero] progress ")]
    assert [p["step"] for p in progress] == ["2/4", "4/4"]
    first = progress[0]
    assert {"loss", "lr", "loss_scale", "samples/s", "tokens/s", "elapsed", "eta"} <= set(first)
    assert float(first["tokens/s"]) == pytest.approx(float(first["samples/s"]) * 16, rel=0.01, abs=1)
    assert "eta" not in progress[1]   # done
    assert not any(line.startswith("[zero] ") for line in results[1].stdout.splitlines())   # rank 0 speaks


def test_resume_continues_from_the_latest_checkpoint(tmp_path):
    save = str(tmp_path / "ckpt")
    check(run_world(SCRIPT, 2, "--steps", "2", "--block_size", "16", "--save_dir", save))
    resumed = check(run_world(SCRIPT, 2, "--steps", "4", "--block_size", "16", "--save_dir", save, "--resume"))
    out = resumed[0].stdout
    assert "[train_gpt] resumed from" in out and "at step 2" in out
    assert "steps=4" in summary(resumed)   # two more steps, not four


def test_the_stage_3_and_offload_example_configs_train():
    for name, stage in (("zero3.json", 3), ("zero2_offload.json", 2)):
        config = str(REPO / "examples" / "configs" / name)
        results = check(run_world(SCRIPT, 2, "--steps", "2", "--block_size", "16", "--config", config))
        assert f"stage={stage}" in summary(results), name


def test_16_bit_on_cpu_is_said_once_not_left_to_be_found():
    config = str(REPO / "examples" / "configs" / "zero2_bf16.json")
    results = check(run_world(SCRIPT, 2, "--steps", "1", "--block_size", "16", "--config", config))
    warned = [line for r in results for line in r.stdout.splitlines() if "bf16 on CPU" in line]
    assert len(warned) == 1 and "slower than fp32" in warned[0]

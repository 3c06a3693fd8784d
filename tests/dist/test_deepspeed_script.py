"""A DeepSpeed-API script (cifar_style.py) runs through the README's porting rule, and unchanged
through ``dslaunch --as-deepspeed`` (issue 17).

The porting rule, as the README states it, applied to import lines only:
    import deepspeed            ->  from launcher import zero as deepspeed
    import deepspeed.X as Y     ->  import launcher.zero.X as Y
    from deepspeed[.X] import   ->  from launcher.zero[.X] import
"""
import json
import re
from pathlib import Path

import pytest

from tests.helpers.world import check, run_world

SCRIPT = Path(__file__).parent / "workers" / "cifar_style.py"
RULES = [(re.compile(r"^(\s*)import deepspeed(\.[\w.]+)?\s*$", re.M), r"\1from launcher import zero as deepspeed"),
         (re.compile(r"^(\s*)import deepspeed\.([\w.]+) as (\w+)", re.M), r"\1import launcher.zero.\2 as \3"),
         (re.compile(r"^(\s*)from deepspeed(\.[\w.]+)? import", re.M), r"\1from launcher.zero\2 import")]


def port(source: str) -> str:
    for pattern, replacement in RULES:
        source = pattern.sub(replacement, source)
    return source


def config(folder: Path, stage: int, bf16: bool) -> Path:
    # the tutorial's ds_config, with a short warm-up so the learning rate moves within the test
    cfg = {"train_batch_size": 16, "steps_per_print": 2000,
           "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                                    "weight_decay": 3e-7}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                        "warmup_num_steps": 5}},
           "gradient_clipping": 1.0, "prescale_gradients": False, "bf16": {"enabled": bf16},
           "fp16": {"enabled": False, "fp16_master_weights_and_grads": False, "loss_scale": 0,
                    "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 15},
           "wall_clock_breakdown": False,
           "zero_optimization": {"stage": stage, "allgather_partitions": True, "reduce_scatter": True,
                                 "allgather_bucket_size": 50000000, "reduce_bucket_size": 50000000,
                                 "overlap_comm": True, "contiguous_gradients": True, "cpu_offload": False}}
    path = folder / f"ds_config_{stage}_{int(bf16)}.json"
    path.write_text(json.dumps(cfg))
    return path


def train(script, folder, cfg, epochs, *launcher_args, name="ckpt"):
    results = check(run_world(script, 2, "--deepspeed", "--deepspeed_config", str(cfg), "--epochs", str(epochs),
                              "--save_dir", str(folder / name), timeout=240, launcher_args=launcher_args))
    return [r.records() for r in results]


@pytest.fixture(scope="module")
def ported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ported")
    text = port(SCRIPT.read_text())
    script = folder / "cifar_ported.py"
    script.write_text(text)
    return folder, script, text


def test_the_rule_changed_only_import_lines(ported):
    _, _, text = ported
    before, after = SCRIPT.read_text().splitlines(), text.splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and len(changed) == 3
    assert all(b.lstrip().startswith(("import ", "from ")) and "deepspeed" in a for a, b in changed)
    assert "import deepspeed" not in text.replace("zero as deepspeed", "")


def test_ported_script_trains_saves_and_resumes_from_latest(ported):
    folder, script, _ = ported
    cfg = config(folder, 2, bf16=False)
    straight = train(script, folder, cfg, 2, name="straight")
    first = train(script, folder, cfg, 1, name="resumed")
    resumed = train(script, folder, cfg, 2, name="resumed")
    for rank in range(2):
        assert [r["epoch"] for r in straight[rank]] == [0, 1]
        assert straight[rank][1]["steps"] == 16          # 128 samples / 16 per step, two epochs
        assert first[rank][0]["loss"] == straight[rank][0]["loss"]
        (again,) = resumed[rank]
        assert again["epoch"] == 1 and again["resumed_from"].endswith("global_step8")
        assert again["loss"] == pytest.approx(straight[rank][1]["loss"], abs=1e-6)
        assert again["steps"] == 16 and again["lr"] == straight[rank][1]["lr"]
    assert straight[0][1]["loss"] < straight[0][0]["loss"]


def test_unchanged_script_runs_with_as_deepspeed(ported):
    folder, script, _ = ported
    cfg = config(folder, 1, bf16=True)
    through_rule = train(script, folder, cfg, 2, name="rule_bf16")
    unchanged = train(SCRIPT, folder, cfg, 2, "--as-deepspeed", name="shim_bf16")
    for rank in range(2):
        assert [r["dtype"] for r in unchanged[rank]] == ["torch.bfloat16"] * 2
        assert [r["loss"] for r in unchanged[rank]] == [r["loss"] for r in through_rule[rank]]


def test_as_deepspeed_refuses_when_a_real_deepspeed_is_importable(tmp_path):
    fake = tmp_path / "site" / "deepspeed"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    results = run_world(SCRIPT, 1, "--save_dir", str(tmp_path / "c"), launcher_args=("--as-deepspeed",),
                        env={"PYTHONPATH": str(tmp_path / "site")})
    assert results[0].returncode == 2
    assert "a real DeepSpeed is installed here" in results[0].stderr
    assert str(fake) in results[0].stderr

"""DeepSpeed's CIFAR-10 MoE tutorial (its ``--moe`` options) through the real launcher.

Unchanged under ``dslaunch --as-deepspeed`` and ported to ``from launcher import zero``, one rank
trains to the per-step losses and final weights recorded from a real DeepSpeed 0.19.8 run
(tests/data/deepspeed-0.19.8/moe_cifar.json). With ep 2, a checkpoint saved on 2 ranks resumes
on 4 (every global expert restored) and joins into one fp32 state dict; resumed on 2 ranks it
continues exactly as an uninterrupted run (expert optimizer state and RNG restored).
"""
import json
import re
from pathlib import Path

import pytest

from launcher.zero.checkpoint.consolidate import get_fp32_state_dict_from_zero_checkpoint
from tests.dist.test_deepspeed_script import port
from tests.helpers import moe_cases
from tests.helpers.world import check, run_world

SCRIPT = Path(__file__).parent / "workers" / "cifar_moe_style.py"
RECORDED = json.loads((Path(__file__).parents[1] / "data" / "deepspeed-0.19.8" / "moe_cifar.json").read_text())


@pytest.fixture(scope="module")
def ds_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "ds_config.json"
    path.write_text(json.dumps(moe_cases.TUTORIAL_CONFIG))
    return path


def train(script, world_size: int, ds_config: Path, *args: str, as_deepspeed: bool = True) -> list[dict]:
    launcher_args = ("--no_local_rank", "--as-deepspeed") if as_deepspeed else ("--no_local_rank",)
    results = check(run_world(script, world_size, "--deepspeed", "--deepspeed_config", str(ds_config), *args,
                              timeout=400, launcher_args=launcher_args))
    return [result.records()[0] for result in results]


def against_recorded(record: dict, recorded: dict) -> tuple[float, float]:
    loss_error = max(abs(a - b) for a, b in zip(record["losses"], recorded["losses"], strict=True))
    weight_error = max(abs(record["weights"][n][0] - d["sum"]) + abs(record["weights"][n][1] - d["norm"])
                       for n, d in recorded["final"].items())
    assert sorted(record["weights"]) == sorted(recorded["final"])
    return loss_error, weight_error


@pytest.mark.parametrize("recorded", RECORDED["runs"], ids=[r["run"]["name"] for r in RECORDED["runs"]])
def test_unchanged_script_trains_like_deepspeed(recorded, ds_config):
    record, = train(SCRIPT, 1, ds_config, "--run", recorded["run"]["name"], "--moe-param-group")
    assert record["lrs"] == pytest.approx(recorded["lrs"], abs=1e-12)
    assert [tuple(g) for g in record["groups"]] == [(g["name"], g["moe"]) for g in recorded["param_groups"]]
    loss_error, weight_error = against_recorded(record, recorded)
    print(recorded["run"]["name"], f"--as-deepspeed vs DeepSpeed 0.19.8: max loss error {loss_error:.1e} over "
          f"{len(record['losses'])} steps, final weight digest error {weight_error:.1e}")
    assert loss_error < 1e-5 and weight_error < 1e-4


def test_ported_script_without_moe_param_groups_trains_like_deepspeed(ds_config, tmp_path):
    """No ``--moe-param-group``: the engine splits the expert parameters into their own group."""
    ported = tmp_path / "cifar_moe_ported.py"
    ported.write_text(port(SCRIPT.read_text()))
    assert "from launcher import zero as deepspeed" in ported.read_text()
    recorded = RECORDED["runs"][0]
    record, = train(ported, 1, ds_config, "--run", recorded["run"]["name"], as_deepspeed=False)
    assert [tuple(g) for g in record["groups"]] == [("dense-params", False), ("ep_size_1", True)]
    loss_error, weight_error = against_recorded(record, recorded)
    assert loss_error < 1e-5 and weight_error < 1e-4


def test_ep_2_checkpoint_resumes_at_another_world_size_and_joins(ds_config, tmp_path):
    run = ("--run", "top2_residual_two_layers", "--moe-param-group", "--ep-world-size", "2")
    saved = train(SCRIPT, 2, ds_config, *run, "--steps", "20", "--save_dir", str(tmp_path / "ckpt"))
    assert saved[0]["ep_ranks"] == [0, 1]
    weights = {name: digest for record in saved for name, digest in record["weights"].items()}
    experts = {m.group(1, 2) for name in weights
               for m in [re.search(r"list\.(\d)\..*deepspeed_experts\.(\d)\.", name)] if m}
    assert experts == {("0", "0"), ("0", "1"), ("1", "0"), ("1", "1"), ("1", "2"), ("1", "3")}   # 2 + 4 experts
    resumed = train(SCRIPT, 4, ds_config, *run, "--steps", "26", "--load_dir", str(tmp_path / "ckpt"))
    loaded = {name: digest for record in resumed for name, digest in record["loaded"].items()}
    assert sorted(loaded) == sorted(weights)
    assert max(abs(loaded[n][0] - weights[n][0]) + abs(loaded[n][1] - weights[n][1]) for n in weights) < 1e-9
    assert all(len(record["losses"]) == 6 for record in resumed)
    joined = get_fp32_state_dict_from_zero_checkpoint(tmp_path / "ckpt")
    # both MoE layers' residual mlp is the one fc3 module: a tied parameter, under both names
    assert set(joined) - set(weights) == {"moe_layer_list.1.mlp.weight", "moe_layer_list.1.mlp.bias"}
    assert set(weights) <= set(joined)
    assert max(abs(float(joined[n].double().sum()) - weights[n][0]) for n in weights) < 1e-9


def test_ep_2_resume_at_the_same_world_size_continues_exactly(ds_config, tmp_path):
    run = ("--run", "top1_rsample", "--moe-param-group", "--ep-world-size", "2")
    straight = train(SCRIPT, 2, ds_config, *run, "--steps", "16")
    train(SCRIPT, 2, ds_config, *run, "--steps", "10", "--save_dir", str(tmp_path / "ckpt"))
    resumed = train(SCRIPT, 2, ds_config, *run, "--steps", "16", "--load_dir", str(tmp_path / "ckpt"))
    for whole, tail in zip(straight, resumed):
        assert tail["losses"] == pytest.approx(whole["losses"][10:], abs=1e-6)
        assert all(abs(tail["weights"][n][0] - whole["weights"][n][0]) < 1e-5 for n in whole["weights"])

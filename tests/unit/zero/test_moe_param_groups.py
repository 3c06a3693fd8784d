"""The optimizer param groups of MoE models, shaped as DeepSpeed's helpers shape them."""
import json
from pathlib import Path

import pytest
import torch

from launcher.zero.errors import ConfigError
from launcher.zero.experts import (MoE, has_moe_layers, is_moe_param, is_moe_param_group,
                                   split_params_into_different_moe_groups_for_optimizer as split)
from launcher.zero.experts.param_groups import configure_moe_param_groups
from tests.helpers import moe_cases

CIFAR = json.loads((Path(__file__).resolve().parents[2] / "data" / "deepspeed-0.19.8" / "moe_cifar.json").read_text())


def _model(ep_sizes=(1, 2)):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), *[MoE(4, torch.nn.Linear(4, 4), num_experts=2, ep_size=ep)
                                                        for ep in ep_sizes], torch.nn.Linear(4, 2))


@pytest.mark.parametrize("recorded", CIFAR["runs"], ids=[r["run"]["name"] for r in CIFAR["runs"]])
def test_tutorial_moe_param_group_matches_deepspeeds(recorded):
    net = moe_cases.tutorial_net(MoE, recorded["run"])
    groups = moe_cases.moe_param_groups(net, split)
    assert [(g["name"], g.get("moe", False), len(g["params"])) for g in groups] == \
        [(g["name"], g["moe"], g["size"]) for g in recorded["param_groups"]]
    assert all(is_moe_param(p) for p in groups[1]["params"]) and not any(is_moe_param(p) for p in groups[0]["params"])


def test_one_moe_group_per_expert_size_keeping_the_options_and_extending_the_list_in_place():
    model = _model()
    groups = [{"params": list(model.parameters()), "name": "all", "weight_decay": 0.1}]
    returned = split(groups)
    assert returned is groups
    assert [(g["name"], g.get("moe", False), g["weight_decay"], len(g["params"])) for g in groups] == \
        [("all", False, 0.1, 6), ("ep_size_1", True, 0.1, 4), ("ep_size_2", True, 0.1, 2)]
    assert all(p.group_name == "ep_size_2" for p in groups[2]["params"])
    assert is_moe_param_group(groups[1]) and not is_moe_param_group(groups[0])


def test_max_group_size_splits_expert_groups():
    model = _model(ep_sizes=(1,))
    groups = split({"params": list(model.parameters()), "name": "all"}, max_group_size=20)
    # expert params: 2 x (16 weight + 4 bias) = 40 elements in 4 tensors -> chunks of at most 20
    assert [(g["name"], [p.numel() for p in g["params"]]) for g in groups[1:]] == \
        [("ep_size_1", [16, 4]), ("ep_size_1", [16, 4])]


def test_has_moe_layers_and_the_engines_configure_step():
    assert has_moe_layers(_model()) == (True, 2)
    assert has_moe_layers(torch.nn.Linear(2, 2)) == (False, 0)
    groups = configure_moe_param_groups(list(_model(ep_sizes=(1,)).parameters()))
    assert [(g["name"], g.get("moe", False)) for g in groups] == [("dense-params", False), ("ep_size_1", True)]
    assert configure_moe_param_groups(groups) is groups              # already split: unchanged


def test_a_group_without_a_name_is_a_config_error():
    with pytest.raises(ConfigError, match="param group 0 has no 'name'"):
        split([{"params": list(_model().parameters())}])

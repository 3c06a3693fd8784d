"""What zero.initialize refuses with MoE layers (one process): each a typed error naming the case."""
import pytest
import torch

from launcher import zero
from launcher.zero.errors import ConfigError, NotSupportedError
from launcher.zero.moe.layer import MoE


def moe_net() -> torch.nn.Module:
    return torch.nn.Sequential(MoE(hidden_size=4, expert=torch.nn.Linear(4, 4), num_experts=2))


def config(stage: int, **extra) -> dict:
    return {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage, **extra},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def test_a_client_optimizer_without_moe_param_groups_is_refused_with_the_helper_named():
    net = moe_net()
    with pytest.raises(ConfigError, match="no optimizer param group is marked 'moe'") as error:
        zero.initialize(model=net, optimizer=torch.optim.AdamW(net.parameters()), config=config(1))
    assert "split_params_into_different_moe_groups_for_optimizer" in error.value.hint


def test_stage_3_and_offload_are_refused_by_name():
    with pytest.raises(NotSupportedError, match="stage 3"):
        zero.initialize(model=moe_net(), config=config(3))
    with pytest.raises(NotSupportedError, match="offload_optimizer"):
        zero.initialize(model=moe_net(), config=config(2, offload_optimizer={"device": "cpu"}))


def test_the_engine_splits_the_expert_params_when_it_builds_the_optimizer():
    engine, optimizer, _, _ = zero.initialize(model=moe_net(), config=config(2))
    assert [(g["name"], g.get("moe", False)) for g in optimizer.param_groups] == [("dense-params", False),
                                                                                  ("ep_size_1", True)]
    engine.destroy()

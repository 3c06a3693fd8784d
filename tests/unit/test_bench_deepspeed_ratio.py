"""bench_variants' DeepSpeed twins of the partial-offload variants hand DeepSpeed the same
offload_optimizer.ratio as ours (issue 43: DeepSpeed's ratio figures beside ours, one run, one card).
DeepSpeed is replaced by a recorder: only the config it would be given is checked (no GPU, no DeepSpeed)."""
import sys
import types

import pytest
import torch

from scripts import bench_variants as bv


@pytest.fixture
def given(monkeypatch):
    """The config each DeepSpeed variant passes to deepspeed.initialize."""
    configs = []
    fake = types.ModuleType("deepspeed")
    fake.init_distributed = lambda **_: None
    fake.initialize = lambda model, model_parameters, config: configs.append(config) or (model, None, None, None)
    moe, utils = types.ModuleType("deepspeed.moe"), types.ModuleType("deepspeed.moe.utils")
    utils.has_moe_layers = lambda _model: (False, 0)
    utils.split_params_into_different_moe_groups_for_optimizer = lambda groups: groups
    for name, module in (("deepspeed", fake), ("deepspeed.moe", moe), ("deepspeed.moe.utils", utils)):
        monkeypatch.setitem(sys.modules, name, module)
    return configs


@pytest.mark.parametrize("ours, states", [("zero3_offload_overlap_ratio30", False),
                                          ("zero3_offload_overlap_bf16states_ratio20", True)])
def test_the_deepspeed_twin_of_a_ratio_variant_gets_the_same_ratio(given, ours, states):
    twin = bv.DEEPSPEED_TWIN[ours]
    settings = bv.Settings(batch=2, device=torch.device("cuda"))   # DeepSpeed's variants run on CUDA only
    bv.VARIANTS[twin](torch.nn.Linear(4, 4), settings)
    zero, mine = given[0]["zero_optimization"], bv.engine_config(3, True, settings, overlap=True, bf16_states=states,
                                                                 ratio=int(ours[-2:]) / 100)["zero_optimization"]
    assert zero["offload_optimizer"]["ratio"] == mine["offload_optimizer"]["ratio"] == int(ours[-2:]) / 100
    assert zero["sub_group_size"] == mine["sub_group_size"] == bv.RATIO_SUB_GROUP
    assert ("bf16_optimizer_states" in given[0]["bf16"]) is states

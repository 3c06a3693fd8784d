"""The parallel layout (distributed/parallel_layout.py): one object every collective asks for its group.

Pure: fake process groups (plain objects) and a duck-typed mpu, no torch.distributed.
"""
import pytest
import torch

from launcher.zero.distributed.context import DistContext
from launcher.zero.distributed.parallel_layout import (AXES, ParallelLayout, TensorParallelInfo, layout_from_mpu,
                                                       single_axis_layout, tensor_partition_dims)
from launcher.zero.errors import ConfigError

DATA, TENSOR, PIPE, EXPERT_DATA = object(), object(), object(), object()


def context(group, rank, size):
    return DistContext(group=group, rank=rank, world_size=size, local_rank=1, device=torch.device("cpu"),
                       backend="gloo", local_world_size=4)


WORLD = context(None, 5, 8)


class Mpu:
    """Megatron's mpu as a script passes it: data 2 x tensor 2 x pipe 2 on 8 ranks, this rank 5."""

    def get_data_parallel_group(self):
        return DATA

    def get_data_parallel_world_size(self):
        return 2

    def get_model_parallel_group(self):
        return TENSOR

    def get_model_parallel_world_size(self):
        return 2

    def get_model_parallel_rank(self):
        return 1

    def get_pipe_parallel_group(self):
        return PIPE

    def get_pipe_parallel_world_size(self):
        return 2


def fake_groups(monkeypatch):
    """torch.distributed's lookups over the fake groups: (rank, size) of this rank in each."""
    places = {DATA: (1, 2), PIPE: (0, 2)}
    import launcher.zero.distributed.context as context_module
    monkeypatch.setattr(context_module.dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(context_module.dist, "get_rank", lambda group=None: places[group][0])
    monkeypatch.setattr(context_module.dist, "get_world_size", lambda group=None: places[group][1])


def test_every_axis_answers_its_group_size_and_rank(monkeypatch):
    fake_groups(monkeypatch)
    layout = layout_from_mpu(WORLD, Mpu())
    assert (layout.group("data"), layout.size("data"), layout.rank("data")) == (DATA, 2, 1)
    assert (layout.group("tensor"), layout.size("tensor"), layout.rank("tensor")) == (TENSOR, 2, 1)
    assert (layout.group("pipe"), layout.size("pipe"), layout.rank("pipe")) == (PIPE, 2, 0)
    # the mpu has no sequence axis: this rank alone, no group to run a collective over
    assert (layout.group("sequence"), layout.size("sequence"), layout.rank("sequence")) == (None, 1, 0)
    assert layout.data is layout.context("data")
    assert layout.context("tensor").device == WORLD.device and layout.context("data").local_rank == 1


def test_without_an_mpu_the_data_axis_is_the_world_and_the_rest_is_this_rank_alone():
    layout = layout_from_mpu(WORLD)
    assert layout.data == WORLD
    assert [layout.size(axis) for axis in AXES] == [8, 1, 1, 1]
    assert layout.tensor_parallel == TensorParallelInfo()


def test_an_mpu_missing_a_method_is_named():
    class Half:
        def get_data_parallel_group(self):
            return DATA

    with pytest.raises(ConfigError, match="mpu lacks get_data_parallel_world_size, get_model_parallel_group") as caught:
        layout_from_mpu(WORLD, Half())
    assert "ParallelGrid" in caught.value.hint


def test_an_unknown_axis_and_a_rank_outside_its_axis_are_config_errors():
    with pytest.raises(ConfigError, match="unknown axis 'model'") as caught:
        ParallelLayout(world=WORLD, axes={"model": WORLD})
    assert "data, tensor, pipe, sequence" in caught.value.hint
    with pytest.raises(ConfigError, match="axis 'tensor' has rank 2 of size 2"):
        ParallelLayout(world=WORLD, axes={"tensor": context(TENSOR, 2, 2)})
    with pytest.raises(ConfigError, match="no axis 'expert'"):
        single_axis_layout(WORLD).group("expert")


def test_autotp_size_is_checked_against_the_tensor_axis(monkeypatch):
    fake_groups(monkeypatch)
    layout = layout_from_mpu(WORLD, Mpu())
    layout.check_config({"tensor_parallel": {"autotp_size": 2}})
    with pytest.raises(ConfigError, match="tensor_parallel.autotp_size is 4 but the model runs with tensor-parallel "
                                          "size 2") as caught:
        layout.check_config({"tensor_parallel": {"autotp_size": 4}})
    assert "apply_tensor_parallel" in caught.value.hint
    with pytest.raises(ConfigError, match="autotp_size is 2 .* size 1"):
        single_axis_layout(WORLD).check_config({"tensor_parallel": {"autotp_size": 2}})


def test_expert_param_groups_are_looked_up_by_name_and_dense_ones_on_the_data_axis():
    expert_data = context(EXPERT_DATA, 0, 4)
    layout = single_axis_layout(WORLD).with_parts(experts={"ep_size_2": expert_data})
    assert layout.expert_data("ep_size_2") is expert_data
    assert layout.param_group_context({"moe": True, "name": "ep_size_2"}) is expert_data
    assert layout.param_group_context({"name": "ep_size_2"}) is layout.data   # not marked moe
    with pytest.raises(ConfigError, match="no expert-data group 'ep_size_4'"):
        layout.expert_data("ep_size_4")
    with pytest.raises(ConfigError, match="'experts_2' is not named ep_size_<N>"):
        layout.with_parts(experts={"experts_2": expert_data})


def test_the_layout_is_frozen_and_its_tensor_axis_is_what_checkpoints_record(monkeypatch):
    fake_groups(monkeypatch)
    model = torch.nn.Linear(2, 2)
    model.weight.tensor_model_parallel, model.weight.partition_dim = True, 0
    layout = layout_from_mpu(WORLD, Mpu()).with_parts(tensor_partition_dims=tensor_partition_dims(model))
    assert layout.tensor_parallel == TensorParallelInfo(rank=1, size=2, partition_dims=(("weight", 0),))
    assert layout.tensor_sharded_names == {"weight"}
    with pytest.raises(AttributeError):
        layout.world = WORLD
    with pytest.raises(TypeError):
        layout.axes["data"] = WORLD

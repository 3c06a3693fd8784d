"""The 3D topology: DeepSpeed's rank order and groups, as a user (or the dry-run) reads them."""
import pytest

from launcher.zero.errors import ConfigError
from launcher.zero.parallel.topology import (PipeDataParallelTopology, PipeModelDataParallelTopology,
                                             ProcessTopology, topology_for)


def test_pipe_data_is_pipe_major():
    topo = PipeDataParallelTopology(num_pp=2, num_dp=3)
    # global rank = stage x D + data index
    assert [topo.get_rank(pipe=s, data=d) for s in range(2) for d in range(3)] == list(range(6))
    assert topo.get_coord(4).pipe == 1 and topo.get_coord(4).data == 1
    assert topo.get_axis_comm_lists("pipe") == [[0, 3], [1, 4], [2, 5]]
    assert topo.get_axis_comm_lists("data") == [[0, 1, 2], [3, 4, 5]]
    assert topo.get_dim("model") == 0 and topo.get_axis_comm_lists("model") == []


@pytest.mark.parametrize("pipe, model, data", [(2, 2, 2), (2, 4, 1), (1, 2, 3), (4, 1, 2)])
def test_3d_order_keeps_tensor_groups_consecutive_and_stages_outermost(pipe, model, data):
    topo = PipeModelDataParallelTopology(num_pp=pipe, num_mp=model, num_dp=data)
    assert topo.get_axis_names() == ["pipe", "data", "model"] and topo.world_size() == pipe * model * data
    for ranks in topo.get_axis_comm_lists("model"):      # tensor-parallel: consecutive ranks
        assert ranks == list(range(ranks[0], ranks[0] + model))
    per_stage = model * data
    for stage in range(pipe):                            # a stage is one contiguous block of ranks
        assert topo.filter_match(pipe=stage) == list(range(stage * per_stage, (stage + 1) * per_stage))
    for rank in range(topo.world_size()):                # coordinates round-trip
        assert topo.get_rank(**topo.get_coord(rank)._asdict()) == rank
    # every axis's groups partition the world
    for axis in ("pipe", "data", "model"):
        flat = sorted(r for ranks in topo.get_axis_comm_lists(axis) for r in ranks)
        assert flat == list(range(topo.world_size()))


def test_222_groups_exactly():
    topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    assert topo.get_axis_comm_lists("model") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert topo.get_axis_comm_lists("data") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.get_rank_repr(5) == "model_01"


@pytest.mark.parametrize("call, match", [
    (lambda: ProcessTopology(["pipe", "pipe"], [1, 2]), "unique"),
    (lambda: ProcessTopology(["pipe"], [0]), "size 0"),
    (lambda: PipeDataParallelTopology(2, 2).get_rank(pipe=0), "every axis"),
    (lambda: PipeDataParallelTopology(2, 2).get_rank(pipe=2, data=0), "outside"),
    (lambda: PipeDataParallelTopology(2, 2).get_coord(4), "outside"),
    (lambda: topology_for(6, pipe=4), "does not divide"),
    (lambda: topology_for(8, pipe=2, model=0), "tensor parallel size 0"),
])
def test_bad_sizes_are_config_errors(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


def test_topology_for_puts_the_rest_on_the_data_axis():
    topo = topology_for(8, pipe=2, model=2)
    assert (topo.get_dim("pipe"), topo.get_dim("data"), topo.get_dim("model")) == (2, 2, 2)


def test_autotp_size_must_match_the_tensor_size_used():
    from launcher.zero.parallel.topology import check_autotp_size
    check_autotp_size({}, 1)
    check_autotp_size({"tensor_parallel": {"autotp_size": 2}}, 2)
    check_autotp_size({"tensor_parallel": {"autotp_size": 1}}, 1)
    with pytest.raises(ConfigError, match="autotp_size is 2 but the model runs with tensor-parallel size 1"):
        check_autotp_size({"tensor_parallel": {"autotp_size": 2}}, 1)

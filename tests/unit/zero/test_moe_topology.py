"""Expert and expert-data groups: the ranks DeepSpeed 0.19.8 puts together, and the sizes refused.

The expected lists are what DeepSpeed's ``groups._get_expert_parallel_ranks(world, 1, ep, pipe,
data_before_expert)`` returns for the same sizes.
"""
import pytest

from launcher.zero.errors import ConfigError, NotSupportedError
from launcher.zero.experts.group_ranks import check_experts_divide, expert_topology
from launcher.zero.parallel.topology import topology_for

DEEPSPEED = [
    # world, ep, pipe, data_before_expert -> expert groups, expert-data groups
    (16, 2, 1, False, [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]],
     [[0, 2, 4, 6, 8, 10, 12, 14], [1, 3, 5, 7, 9, 11, 13, 15]]),
    (8, 2, 1, True, [[0, 4], [1, 5], [2, 6], [3, 7]], [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (8, 2, 2, False, [[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2], [1, 3], [4, 6], [5, 7]]),
    (8, 4, 1, True, [[0, 2, 4, 6], [1, 3, 5, 7]], [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (12, 2, 2, True, [[0, 3], [1, 4], [2, 5], [6, 9], [7, 10], [8, 11]], [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]),
    (4, 1, 1, False, [[0], [1], [2], [3]], [[0, 1, 2, 3]]),
    (4, 4, 1, False, [[0, 1, 2, 3]], [[0], [1], [2], [3]]),
]


@pytest.mark.parametrize("world, ep, pipe, data_first, expert, expert_data", DEEPSPEED)
def test_groups_are_deepspeeds(world, ep, pipe, data_first, expert, expert_data):
    topology = expert_topology(topology_for(world, pipe=pipe), ep, data_before_expert=data_first)
    assert [list(g) for g in topology.expert_groups] == expert
    assert [list(g) for g in topology.expert_data_groups] == expert_data
    assert topology.name == f"ep_size_{ep}"
    for rank in range(world):      # each rank: one group of each kind, its position = its experts
        assert rank in topology.expert_group_of(rank) and rank in topology.expert_data_group_of(rank)
        assert topology.expert_group_of(rank)[topology.expert_rank(rank)] == rank


def test_an_ep_size_that_does_not_divide_the_data_ranks_names_the_sizes():
    with pytest.raises(ConfigError, match=r"ep_size 4 does not divide the data-parallel size 6 "
                                          r"\(world 12 = pipe 2 x data 6 x tensor 1\)") as raised:
        expert_topology(topology_for(12, pipe=2), 4)
    assert "1, 2, 3, 6" in raised.value.hint
    with pytest.raises(ConfigError, match="ep_size 0 is not an integer"):
        expert_topology(topology_for(4), 0)


def test_an_ep_size_that_does_not_divide_the_experts_names_both():
    with pytest.raises(ConfigError, match="ep_size 4 does not divide num_experts 6") as raised:
        check_experts_divide(6, 4)
    assert "[1, 2, 3, 6]" in raised.value.hint
    check_experts_divide(8, 4)


def test_tensor_parallel_experts_are_refused_by_name():
    with pytest.raises(NotSupportedError, match="MoE with tensor parallelism"):
        expert_topology(topology_for(8, model=2), 2)

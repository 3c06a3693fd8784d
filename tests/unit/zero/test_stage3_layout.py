"""Stage 3's pure partition math: shard sizes, per-rank coverage, persistence choice, master layout."""

import pytest

from launcher.zero.stages.stage3.layout import choose_persistent, plan_group
from launcher.zero.stages.stage3.params import shard_numel, shard_range


@pytest.mark.parametrize("numel,world_size", [(1, 1), (1, 3), (10, 3), (12, 4), (7, 8), (100003, 7)])
def test_shards_cover_the_parameter_exactly_once(numel, world_size):
    covered = []
    for rank in range(world_size):
        start, end = shard_range(numel, world_size, rank)
        assert 0 <= end - start <= shard_numel(numel, world_size)
        covered.extend(range(start, end))
    assert covered == list(range(numel))
    assert shard_numel(numel, world_size) * world_size >= numel


def test_persistent_params_are_the_small_ones_within_the_model_budget():
    assert choose_persistent([5, 200, 50, 99], threshold=100, model_budget=10**9) == [True, False, True, True]
    # smallest first until the budget is spent
    assert choose_persistent([5, 60, 50], threshold=100, model_budget=60) == [True, False, True]
    assert choose_persistent([5, 6], threshold=0, model_budget=10**9) == [False, False]


def test_group_layout_puts_shards_and_whole_params_end_to_end():
    slots, total = plan_group(["w", "b", "v"], [(10, 3), (3,), (5,)], [False, True, False], world_size=4, rank=3)
    w, b, v = slots
    assert (w.offset, w.length, w.param_start, w.param_end) == (0, 8, 24, 30)
    assert (b.offset, b.length, b.param_start, b.param_end, b.persistent) == (8, 3, 0, 3, True)
    # 5 elements over 4 ranks: shard of 2, rank 3 covers nothing (all padding)
    assert (v.offset, v.length, v.covered) == (11, 2, 0)
    assert total == 13

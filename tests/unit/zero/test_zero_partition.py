"""Pure partition and bucket math: any world size, remainders, owners."""
import pytest

from launcher.zero.stages.buckets import BucketQueue
from launcher.zero.layout.partition_math import flat_layout, plan_buckets

SHAPES = [(5, 7), (5,), (3, 5), (3,)]  # 58 elements


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 64])
def test_partitions_cover_every_element_once(world_size):
    layout = flat_layout(["a", "b", "c", "d"], SHAPES, world_size)
    assert layout.numel == 58 and layout.padded_numel % world_size == 0 and layout.padded_numel >= 58
    assert layout.padded_numel - 58 < world_size or layout.padded_numel == world_size
    covered = []
    for rank in range(world_size):
        for piece in layout.pieces_of_rank(rank):
            slot = layout.slots[piece.slot]
            assert slot.offset <= piece.flat_start and piece.flat_end <= slot.end
            covered += range(piece.flat_start, piece.flat_end)
    assert covered == list(range(58))


def test_split_by_owner_cuts_at_partition_edges():
    layout = flat_layout(["a"], [(10,)], 3)  # padded to 12, partitions of 4
    pieces = layout.split_by_owner(3, 9)
    assert [(p.rank, p.flat_start, p.numel) for p in pieces] == [(0, 3, 1), (1, 4, 4), (2, 8, 1)]


def test_buckets_are_whole_params_last_first():
    layout = flat_layout(["a", "b", "c", "d"], SHAPES, 2)
    buckets = plan_buckets(layout, 16)
    assert [(b.first, b.last) for b in buckets] == [(2, 4), (0, 2)]
    assert buckets[0].start == 40 and buckets[0].end == 58 and buckets[1].numel == 40
    assert [(b.first, b.last) for b in plan_buckets(layout, 10**9)] == [(0, 4)]


def test_bucket_queue_launches_in_plan_order():
    launched = []
    queue = BucketQueue([["x", "y"], ["z"]], launched.append)
    queue.arm()
    queue.mark("z")          # bucket 1 complete first, but must wait for bucket 0
    assert launched == []
    queue.mark("x")
    queue.mark("y")
    assert launched == [0, 1]
    queue.arm()
    queue.mark("x")
    queue.flush()            # unused parameters: the rest launches after backward
    assert launched == [0, 1, 0, 1]

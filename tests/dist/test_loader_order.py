"""``deepspeed.initialize(training_data=...)``'s loader gives each rank DeepSpeed's batches (issue 30).

DeepSpeed 0.19.8's engine loader is a ``DistributedSampler`` with its defaults (shuffle, seed 0, the
dataset padded to a multiple of the world size by repeating its first indices) under a DataLoader of
the micro-batch size that keeps a short last batch unless ``dataloader_drop_last``; it never calls
``set_epoch``, so every pass repeats the first pass's order until the script calls
``loader.data_sampler.set_epoch``. The pipeline engine's loader is the same sampler without
shuffling, repeated. The expected batches are computed here with torch, and checked once against
what a real DeepSpeed gave (tests/data/deepspeed-0.19.8/loader_order.json).
"""
from __future__ import annotations

import pytest
from torch.utils.data import DataLoader, DistributedSampler

from tests.helpers.recorded import recorded
from tests.helpers.world import REPO, check, run_world

WORKER = REPO / "tests" / "dist" / "workers" / "loader_order_worker.py"
WORLD_SIZE = 2
CASES = [tuple(case["args"]) for case in recorded("loader_order")["cases"]]


def batches(samples: int, micro: int, replicas: int, rank: int, shuffle: bool, drop_last: bool, epoch=None):
    sampler = DistributedSampler(range(samples), num_replicas=replicas, rank=rank, shuffle=shuffle)
    if epoch is not None:
        sampler.set_epoch(epoch)
    return [batch.tolist() for batch in DataLoader(range(samples), batch_size=micro, sampler=sampler, drop_last=drop_last)]


def expected(args: tuple[str, ...], rank: int) -> list[list[list[int]]]:
    """Per pass over the loader, this rank's batches of sample indices, as DeepSpeed's loader gives them."""
    kind, samples, micro, _gas, last = args[0], *map(int, args[1:])
    if kind == "engine":
        first = batches(samples, micro, WORLD_SIZE, rank, shuffle=True, drop_last=bool(last))
        return [first, first, batches(samples, micro, WORLD_SIZE, rank, True, bool(last), epoch=3)]
    stages = last
    replicas = WORLD_SIZE // stages
    one = batches(samples, micro, replicas, rank % replicas, shuffle=False, drop_last=False)
    return [one, one, one]


@pytest.mark.parametrize("args", CASES, ids="-".join)
def test_expected_order_is_what_deepspeed_gave(args):
    (case,) = [c for c in recorded("loader_order")["cases"] if tuple(c["args"]) == args]
    assert case["ranks"] == [expected(args, rank) for rank in range(WORLD_SIZE)]


@pytest.mark.parametrize("args", CASES, ids="-".join)
def test_each_rank_gets_deepspeeds_batches(args):
    results = check(run_world(WORKER, WORLD_SIZE, *args, launcher_args=("--as-deepspeed", "--no_local_rank")))
    for result in results:
        (record,) = result.records()
        want = expected(args, record["rank"])
        assert record["passes"][:2] == want[:2], f"rank {record['rank']}: the first two passes"
        assert "RESULT_ERROR" not in result.stdout, result.stdout.split("RESULT_ERROR")[1].splitlines()[0]
        assert record["passes"][2] == want[2], f"rank {record['rank']}: after data_sampler.set_epoch(3)"

"""The engine's loader (``training_data=``): DeepSpeed's batches per rank, and a pass resumable at any world size."""
import pytest
from torch.utils.data import DataLoader, DistributedSampler

from launcher.zero.data.loader import EngineDataLoader, EngineSampler


def loaders(length, world, micro, drop_last=False):
    return [EngineDataLoader(range(length), micro, EngineSampler(range(length), world, rank), world, drop_last=drop_last)
            for rank in range(world)]


def steps(ranks, accumulation, count=None):
    """Per optimizer step, the sorted samples all ranks take together, over one pass of each rank's loader."""
    passes = [[batch.tolist() for batch in loader] for loader in ranks]
    total = len(passes[0]) // accumulation if count is None else count
    return [sorted(i for batches in passes for batch in batches[s * accumulation:(s + 1) * accumulation] for i in batch)
            for s in range(total)]


@pytest.mark.parametrize("length, world, micro, drop_last", [(51, 2, 4, False), (51, 2, 4, True), (50, 4, 3, False),
                                                               (7, 3, 2, False), (96, 8, 1, True)])
def test_each_rank_gets_distributed_samplers_batches(length, world, micro, drop_last):
    for rank, loader in enumerate(loaders(length, world, micro, drop_last)):
        torch_sampler = DistributedSampler(range(length), num_replicas=world, rank=rank)
        want = [b.tolist() for b in DataLoader(range(length), batch_size=micro, sampler=torch_sampler, drop_last=drop_last)]
        assert [b.tolist() for b in loader] == want
        assert [b.tolist() for b in loader] == want, "without set_epoch every pass repeats the first (DeepSpeed)"
        assert len(loader) == len(want)


@pytest.mark.parametrize("world, micro, accumulation", [(4, 1, 2), (2, 1, 4), (1, 2, 4), (8, 1, 1), (2, 2, 2)])
def test_a_step_takes_the_same_samples_at_every_world_size(world, micro, accumulation):
    assert steps(loaders(48, world, micro), accumulation) == steps(loaders(48, 4, 1), 2)


@pytest.mark.parametrize("taken_steps", [1, 2, 5])
def test_a_pass_checkpointed_at_four_ranks_continues_at_two_with_the_next_unseen_samples(taken_steps):
    unbroken = steps(loaders(48, 4, 1), 2)                 # 6 steps of 8 samples
    first = loaders(48, 4, 1)
    for loader in first:
        batches = iter(loader)
        for _ in range(2 * taken_steps):
            next(batches)
    (position,) = {str(loader.position()) for loader in first}  # every rank agrees where the pass stands
    second = loaders(48, 2, 1)
    for loader in second:
        loader.resume(first[0].position())
        assert loader.position() == first[0].position(), "a save before the next pass keeps the position"
    assert steps(second, 4) == unbroken[taken_steps:]
    assert steps(second, 4) == unbroken, "the pass after the resumed one is a whole pass"


def test_a_pass_checkpointed_at_its_end_resumes_with_a_whole_pass():
    first = loaders(51, 2, 4)[0]
    assert len(list(first)) == 7
    assert first.position()["start"] == 0
    resumed = loaders(51, 2, 4)[0]
    resumed.resume(first.position())
    assert [b.tolist() for b in resumed] == [b.tolist() for b in loaders(51, 2, 4)[0]]


def test_the_epoch_set_by_the_script_is_kept_with_the_position():
    first = loaders(40, 2, 2)
    for loader in first:
        loader.data_sampler.set_epoch(3)
        batches = iter(loader)
        next(batches), next(batches)
    unbroken = loaders(40, 2, 2)
    for loader in unbroken:
        loader.data_sampler.set_epoch(3)
    second = loaders(40, 1, 2)
    second[0].resume(first[0].position())
    assert second[0].position() == {"epoch": 3, "start": 8}
    assert steps(second, 2, count=8) == steps(unbroken, 1)[2:]

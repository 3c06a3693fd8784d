"""The engine's data sampler: one global order, split over any world size, resumable."""
import pytest

from launcher.zero.engine.data import GlobalBatchSampler


def steps(length, world, micro, accumulation, consumed=0, passes=1):
    """Per optimizer step, the set of samples all ranks take together."""
    samplers = [GlobalBatchSampler(length, world, r, micro, accumulation, seed=7) for r in range(world)]
    for sampler in samplers:
        sampler.resume(consumed)
    per_rank = [[i for _ in range(passes) for i in sampler] for sampler in samplers]
    take = micro * accumulation
    count = len(per_rank[0]) // take
    return [sorted(i for rank in per_rank for i in rank[s * take:(s + 1) * take]) for s in range(count)]


@pytest.mark.parametrize("world, micro, accumulation", [(4, 1, 2), (2, 1, 4), (1, 2, 4), (8, 1, 1), (2, 2, 2)])
def test_every_world_size_takes_the_same_samples_per_step(world, micro, accumulation):
    assert steps(50, world, micro, accumulation) == steps(50, 4, 1, 2)


@pytest.mark.parametrize("consumed", [0, 8, 24, 48, 56])
def test_resume_continues_at_the_next_unseen_sample_at_another_world_size(consumed):
    unbroken = steps(50, 4, 1, 2, passes=3)           # 6 steps an epoch, 3 epochs
    resumed = steps(50, 2, 1, 4, consumed=consumed, passes=3 - consumed // 48)
    assert resumed[:len(unbroken) - consumed // 8] == unbroken[consumed // 8:]


def test_an_epoch_is_a_permutation_without_the_incomplete_last_global_batch():
    epoch = [i for step in steps(50, 4, 1, 2) for i in step]
    assert len(epoch) == len(set(epoch)) == 48
    assert GlobalBatchSampler(50, 4, 0, 1, 2).__len__() == 12

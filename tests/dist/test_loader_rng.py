"""``training_data=``'s loader leaves torch's RNG as DeepSpeed 0.19.8's does (issue 41 item 5's data path).

DeepSpeed's engine loader reads batches in 2 worker processes per rank, seeded from a base seed that
the DataLoader draws from the global RNG when its iterator starts, at ``iter(loader)``. A loader that
reads in the rank draws a random transform's numbers from the stream dropout draws from (this
engine's did: 2.9e-2 from DeepSpeed at the first micro-batch, 0.41 at worst); one that starts its
iterator at the first batch draws the seed later. Either moves every later dropout mask and
augmentation. The worker (a random flip and noise in the dataset, dropout 0.5, fp32 Adam, three
passes of RepeatingLoader) is replayed against DeepSpeed's recorded run
(tests/data/deepspeed-0.19.8/loader_rng.json, scripts/record_deepspeed_losses.py --only
loader_rng), every micro-batch's loss on both ranks.
"""
from tests.helpers.recorded import FP32_TOLERANCE, straight_run


def test_random_transforms_and_dropout_draw_what_deepspeeds_do(tmp_path_factory):
    _, ours, theirs = straight_run("loader_rng", tmp_path_factory)
    for rank, (mine, reference) in enumerate(zip(ours["ranks"], theirs["ranks"])):
        gaps = [abs(a - b) for a, b in zip(mine, reference)]
        assert len(mine) == len(reference) == 16
        assert max(gaps) <= FP32_TOLERANCE, f"rank {rank}: ours {mine} vs DeepSpeed's {reference}"

"""offload_optimizer.ratio's split (stages/partial_offload.py): which parameters keep their
optimizer states on the device is DeepSpeed 0.19.8's rule: sub-groups cut by
``_create_fp16_sub_groups`` (runtime/zero/stage3.py), numbered across the optimizer groups, the first
``int((1 - ratio) * count)`` on the accelerator (``_create_fp32_partitions``)."""
import random
from types import SimpleNamespace

import pytest
import torch

from launcher.zero.stages.base import square_sum as tensor_square_sum
from launcher.zero.stages.stage3.layout import plan_group
from launcher.zero.stages.partial_offload import (device_params, device_sub_groups, partition_kept, share,
                                                  sub_group_lengths)
from launcher.zero.stages.stage3.square_sum import _from_device

# (shares per optimizer group, sub_group_size, ratio) -> leading parameters kept on the device per group
CASES = [
    ([[224, 2048, 96], [32, 32, 2]], 200, 0.5, [2, 0]),        # 4 sub-groups, 2 stay: the first group splits
    ([[224, 2048, 96], [32, 32, 2]], 200, 0.25, [3, 0]),       # int(0.75 * 4) = 3: the whole first group
    ([[224, 2048, 96], [32, 32, 2]], 200, 0.0, [3, 3]),        # everything on the device
    ([[224, 2048, 96], [32, 32, 2]], 200, 1.0, [0, 0]),        # full offload
    ([[224, 2048, 96], [32, 32, 2]], 10 ** 9, 0.5, [3, 0]),    # default size: a sub-group per group, int(1.0) = 1
    ([[224, 2048, 96], [32, 32, 2]], 10 ** 9, 0.6, [0, 0]),    # int(0.8) = 0: a small model keeps nothing
    ([[5, 5, 5, 5, 5]], 10, 0.3, [4]),                          # [2, 2, 1]: int(0.7 * 3) = 2 sub-groups
    ([[5] * 10], 5, 0.7, [3]),                                  # 10 sub-groups, (1 - 0.7) * 10 = 3.0000000000000004
]


@pytest.mark.parametrize("shares, size, ratio, kept", CASES)
def test_the_split_is_deepspeeds_rule_by_hand(shares, size, ratio, kept):
    assert device_params(shares, size, ratio) == kept


def test_a_share_is_deepspeeds_partition_numel():
    assert [share(n, 2) for n in (448, 4096, 192, 3, 1)] == [224, 2048, 96, 2, 1]


def _deepspeed_kept(groups, size, ratio):
    """DeepSpeed 0.19.8's own cut (its method on a stand-in), then its device rule, per group."""
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    cut = stage3.DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups
    owner = SimpleNamespace(sub_group_size=size)
    sub_groups = []
    for group in groups:
        params = [SimpleNamespace(partition_numel=lambda n=n: n) for n in group]
        sub_groups.append(cut(owner, params))
    count = sum(len(each) for each in sub_groups)
    on_device = [i < int((1 - ratio) * count) for i in range(count)]   # stage3.py: i >= int(...) -> 'cpu'
    kept, index = [], 0
    for each in sub_groups:
        kept.append(sum(len(sub) for sub in each if on_device[(index := index + 1) - 1]))
    return kept


def test_the_split_equals_the_installed_deepspeeds_on_random_models():
    rng = random.Random(43)
    for _ in range(300):
        groups = [[rng.randint(1, 300) for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(1, 3))]
        size = rng.choice([1, 50, 100, 256, 10 ** 9])
        ratio = rng.choice([0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 0.9, 1.0, rng.random()])
        assert device_params(groups, size, ratio) == _deepspeed_kept(groups, size, ratio), (groups, size, ratio)


def test_sub_groups_and_the_device_count_on_their_own():
    assert sub_group_lengths([5, 5, 5, 5, 5], 10) == [2, 2, 1]
    assert sub_group_lengths([3, 4], 7) == [2]
    assert [device_sub_groups(10, r) for r in (0.0, 0.3, 0.7, 1.0)] == [10, 7, 3, 0]


# stages 1-2 (partition_kept): the lengths of the fragments in one rank's partition, per group
PARTITION_CASES = [
    ([[448, 1920], [64, 2]], 200, 0.5, [1, 0]),     # the 7-64-64-3 MLP's rank 0 of 2: 3 sub-groups, 1 stays
    ([[2176, 192], [62, 3]], 200, 0.5, [1, 0]),     # its rank 1: the cut may differ from rank to rank
    ([[448, 1920], [64, 2]], 200, 0.0, [2, 2]),
    ([[448, 4096, 192], [131]], 10 ** 9, 0.5, [3, 0]),   # default size: one sub-group per group, int(1.0)
    ([[], [5, 5]], 5, 0.5, [0, 1]),                 # no fragment here: no sub-group (DeepSpeed's stage 3 counts one)
    ([[], []], 5, 0.0, [0, 0]),
]


@pytest.mark.parametrize("groups, size, ratio, kept", PARTITION_CASES)
def test_stages_1_and_2_cut_each_partition_by_the_same_rule(groups, size, ratio, kept):
    assert partition_kept(groups, size, ratio) == kept


@pytest.mark.parametrize("rank", [0, 1])
def test_the_offload_norm_counts_the_gradients_kept_on_the_device(rank):
    """With offload from a GPU the norm adds squares measured as shards were copied out; a
    position kept on the device (ratio) is measured from its buffer, persistent parameters on rank 0."""
    torch.manual_seed(0)
    kept_slots, _ = plan_group(["a", "b"], [(6,), (3,)], [False, True], 2, rank)
    host_slots, _ = plan_group(["c", "d"], [(8,), (2,)], [False, True], 2, rank)
    kept = SimpleNamespace(grad=torch.randn(sum(s.length for s in kept_slots)))
    host = SimpleNamespace(grad=torch.randn(sum(s.length for s in host_slots)))
    copied = tensor_square_sum(host.grad[host_slots[0].offset:host_slots[0].offset + host_slots[0].length])
    context = SimpleNamespace(dist_context=SimpleNamespace(rank=rank, world_size=1, device=torch.device("cpu")))
    strategy = SimpleNamespace(context=context, masters=[kept, host], group_slots=[kept_slots, host_slots],
                               on_device=[True, False], _device_squares=copied)
    partitioned = kept.grad[:3].square().sum() + host.grad[:4].square().sum()
    whole = kept.grad[3:].square().sum() + host.grad[4:].square().sum()
    want = partitioned + (whole if rank == 0 else 0)
    assert float(_from_device(strategy)) == pytest.approx(float(want), rel=1e-6)


@pytest.fixture
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_another_optimizer_than_the_cpu_adam_is_refused_by_name(stage, no_process_group_left):
    """DeepSpeed: "Hybrid Optimizer Only Supports DeepSpeedCPUAdam"; here a ConfigError with a hint."""
    from launcher import zero
    from launcher.zero.errors import ConfigError
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    config = {"train_micro_batch_size_per_gpu": 2, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}}
    with pytest.raises(ConfigError, match="ratio 0.5 needs the CPU Adam, not SGD") as caught:
        zero.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config)
    assert "AdamW" in caught.value.hint

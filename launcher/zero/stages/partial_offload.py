"""``offload_optimizer.ratio``: which parameters' optimizer states stay on the device (pure).

DeepSpeed 0.19.8 (runtime/zero/stage3.py) cuts each optimizer group into *sub-groups*
(``_create_fp16_sub_groups``: parameters in group order until one rank's share reaches
``sub_group_size``), numbers them across all groups, and keeps the first
``int((1 - ratio) * count)`` of them on the accelerator (``_create_fp32_partitions``): their fp32
masters, Adam moments and step stay there, the rest go to the host's CPU Adam. With the default
``sub_group_size`` (1e9) a small model has one sub-group per optimizer group, so a ratio keeps a
whole group or nothing on the device; a smaller ``sub_group_size`` makes the cut finer.

A parameter's *share* is what one rank holds of it in DeepSpeed (``partition_numel``:
ceil(numel / world_size), for the small "persistent" parameters too), so the cut is the same on
every rank and the same as DeepSpeed's.

Stages 1 and 2 (``partition_kept``): DeepSpeed 0.19.8 has no ratio there (its config refuses
``ratio`` below 1 unless the stage is 3: "Partial offloading only supported for ZeRO Stage 3.";
stage_1_and_2.py never reads it), so dslaunch defines it with the same rule over this rank's
partition: its *fragments* (the parts of parameters inside the partition, in flat order) take the
place of the shares, so sub-groups, and the cut, may differ from rank to rank.
"""
from __future__ import annotations


def share(numel: int, world_size: int) -> int:
    """One rank's part of a parameter of ``numel`` elements, as DeepSpeed counts it."""
    return -(-int(numel) // int(world_size))


def sub_group_lengths(shares: list[int], sub_group_size: int) -> list[int]:
    """How many parameters each sub-group of one optimizer group holds (``_create_fp16_sub_groups``):
    one sub-group when the whole group fits, else parameters in order until the sum reaches
    ``sub_group_size`` (the last sub-group takes what is left)."""
    if sub_group_size >= sum(shares):
        return [len(shares)]
    lengths, count, size = [], 0, 0
    for index, value in enumerate(shares):
        count, size = count + 1, size + value
        if size >= sub_group_size or index == len(shares) - 1:
            lengths.append(count)
            count, size = 0, 0
    return lengths


def device_sub_groups(count: int, ratio: float) -> int:
    """How many leading sub-groups (of ``count``) stay on the device: DeepSpeed's expression,
    float rounding included (``i >= int((1 - ratio) * count)`` goes to the CPU)."""
    return int((1 - ratio) * count)


def device_params(groups: list[list[int]], sub_group_size: int, ratio: float) -> list[int]:
    """Per optimizer group (each a list of its trainable parameters' shares, in group order), the
    number of leading parameters whose optimizer states stay on the device."""
    lengths = [sub_group_lengths(shares, sub_group_size) for shares in groups]
    left = device_sub_groups(sum(len(each) for each in lengths), ratio)
    kept = []
    for each in lengths:
        taken = each[:max(0, left)]
        kept.append(sum(taken))
        left -= len(taken)
    return kept


def partition_kept(groups: list[list[int]], sub_group_size: int, ratio: float) -> list[int]:
    """Stages 1-2: per optimizer group (each the lengths of the fragments in this rank's partition,
    in flat order), how many leading fragments keep their optimizer states on the device; a group
    with no fragment on this rank makes no sub-group (it holds nothing to place)."""
    present = [lengths for lengths in groups if lengths]
    kept = iter(device_params(present, sub_group_size, ratio))
    return [next(kept) if lengths else 0 for lengths in groups]

"""Gradient buckets launched in a fixed order as backward produces their gradients.

Every rank must issue collectives in the same order, but backward may finish parameters in a
different order on different ranks; so a bucket is launched only when it and every bucket
before it (in plan order: last parameters first) are complete. ``flush`` launches the rest,
treating parameters that got no gradient (unused in this forward) as zero.
"""
from __future__ import annotations

from typing import Callable

import torch

from launcher.zero.layout.partition_math import Bucket, plan_buckets


class BucketQueue:
    """Counts ready gradients per bucket and calls ``launch(bucket_index)`` in bucket order.

    ``members[i]`` lists the keys (e.g. ``(group, slot)``) whose gradients bucket i needs.
    """

    def __init__(self, members: list[list], launch: Callable[[int], None]):
        self.sizes = [len(keys) for keys in members]
        self.launch = launch
        self.bucket_of = {key: index for index, keys in enumerate(members) for key in keys}
        self.armed = False
        self.ready: list[int] = []
        self.seen: set = set()
        self.next_bucket = 0

    def arm(self) -> None:
        """Start listening for this backward's gradients."""
        self.armed = True
        self.ready = [0] * len(self.sizes)
        self.seen = set()
        self.next_bucket = 0

    def mark(self, key) -> None:
        """The gradient for ``key`` is final; launch whatever became complete."""
        if not self.armed or key in self.seen:
            return
        self.seen.add(key)
        self.ready[self.bucket_of[key]] += 1
        while self.next_bucket < len(self.sizes) and self.ready[self.next_bucket] == self.sizes[self.next_bucket]:
            self.next_bucket += 1
            self.launch(self.next_bucket - 1)

    def flush(self) -> None:
        """Launch every bucket not launched yet (after backward returned)."""
        if not self.armed:
            return
        while self.next_bucket < len(self.sizes):
            self.next_bucket += 1
            self.launch(self.next_bucket - 1)
        self.armed = False


def plan_all_buckets(groups, bucket_numel: int, order: dict[str, int]) -> list[tuple[int, "Bucket"]]:
    """Buckets of every group, in the order backward is expected to finish them (last module first)."""
    planned = []
    for group in groups:
        for bucket in plan_buckets(group.layout, bucket_numel):
            names = group.names[bucket.first:bucket.last]
            planned.append((max(order[n] for n in names), group.index, bucket))
    planned.sort(key=lambda item: (-item[0], item[1]))
    return [(group_index, bucket) for _, group_index, bucket in planned]


def register_grad_hooks(params: list[torch.nn.Parameter], on_ready: Callable[[int], None]) -> list:
    """Call ``on_ready(i)`` once parameter i's gradient is accumulated in a backward pass."""
    handles = []
    for index, param in enumerate(params):
        handles.append(param.register_post_accumulate_grad_hook(lambda _p, i=index: on_ready(i)))
    return handles

"""``training_data`` -> a DataLoader over global sample indices that resumes at any world size.

Every optimizer step takes the next ``train_batch_size`` samples of one global order (a seeded
permutation per epoch), whatever the world size: rank r's micro-batch m of a step is the slice
``(m * world_size + r) * micro_batch`` of that step's samples. So the step's samples, and with
them the loss averaged over the global batch, do not depend on how many ranks share it, and a
checkpoint's ``global_samples`` is enough to continue at the next unseen sample (``resume``).
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Sampler


class GlobalBatchSampler(Sampler):
    """This rank's sample indices, step after step, over one global order of the dataset.

    Incomplete global batches at an epoch's end are left out (all ranks must take part in a step).
    """

    def __init__(self, length: int, world_size: int, rank: int, micro_batch: int, accumulation: int,
                 shuffle: bool = True, seed: int = 0):
        self.length, self.world_size, self.rank = length, world_size, rank
        self.micro_batch, self.accumulation = micro_batch, accumulation
        self.global_batch = micro_batch * accumulation * world_size
        self.shuffle, self.seed = shuffle, seed
        self.epoch = 0
        self._skip = 0  # samples of this epoch already consumed before a resume

    def steps_per_epoch(self) -> int:
        return self.length // self.global_batch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, consumed_samples: int) -> None:
        """Continue after `consumed_samples` global samples (a checkpoint's ``global_samples``)."""
        per_epoch = self.steps_per_epoch() * self.global_batch
        if per_epoch == 0:
            return
        self.epoch, self._skip = divmod(consumed_samples, per_epoch)

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.length, generator=generator).tolist()

    def __iter__(self):
        order, skip = self._order(), self._skip
        self._skip = 0
        mine = []
        for start in range(skip, self.steps_per_epoch() * self.global_batch, self.global_batch):
            for micro in range(self.accumulation):
                offset = start + (micro * self.world_size + self.rank) * self.micro_batch
                mine += order[offset:offset + self.micro_batch]
        self.epoch += 1  # the next pass over the loader is the next epoch
        return iter(mine)

    def __len__(self) -> int:
        steps = self.steps_per_epoch() - self._skip // max(self.global_batch, 1)
        return max(0, steps) * self.micro_batch * self.accumulation


def build_dataloader(dataset, config, dist_context, collate_fn=None, pin_memory: bool | None = None,
                     num_workers: int = 0) -> DataLoader:
    """Micro-batches of ``train_micro_batch_size_per_gpu`` samples, this rank's part of each global batch.
    ``pin_memory``: page-locked batches for faster copies to a GPU (default: on when training on one)."""
    sampler = GlobalBatchSampler(len(dataset), dist_context.world_size, dist_context.rank,
                                 config.train_micro_batch_size_per_gpu, config.gradient_accumulation_steps)
    on_gpu = dist_context.device.type == "cuda" and torch.cuda.is_available()
    return DataLoader(dataset, batch_size=config.train_micro_batch_size_per_gpu, sampler=sampler,
                      collate_fn=collate_fn, drop_last=True, num_workers=num_workers,
                      pin_memory=on_gpu if pin_memory is None else bool(pin_memory) and torch.cuda.is_available())


class RepeatingLoader:
    """Wraps an iterable (a DataLoader) and starts it again when it runs out, forever."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)

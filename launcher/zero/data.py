"""``training_data`` -> a DataLoader whose DistributedSampler gives each rank its share."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, DistributedSampler


def build_dataloader(dataset, config, dist_context, collate_fn=None) -> DataLoader:
    """Micro-batches of ``train_micro_batch_size_per_gpu`` samples from this rank's shard."""
    sampler = DistributedSampler(dataset, num_replicas=dist_context.world_size, rank=dist_context.rank,
                                 shuffle=True, drop_last=config.dataloader_drop_last)
    return DataLoader(dataset, batch_size=config.train_micro_batch_size_per_gpu, sampler=sampler,
                      collate_fn=collate_fn, drop_last=config.dataloader_drop_last,
                      pin_memory=dist_context.device.type == "cuda" and torch.cuda.is_available())

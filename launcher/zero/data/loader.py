"""``training_data`` -> DeepSpeed's loader: the same batches on each rank, and a pass resumable at any world size.

DeepSpeed 0.19.8's engine loader is a ``DistributedSampler`` with torch's defaults (shuffled with seed
0; the order padded to a multiple of the world size by repeating its first indices) under a
DataLoader of the micro-batch size that keeps a short last batch unless ``dataloader_drop_last``.
Nothing calls ``set_epoch``: every pass repeats the first pass's order until the script calls
``loader.data_sampler.set_epoch``. ``EngineDataLoader`` yields exactly those batches.

It also leaves torch's global RNG as DeepSpeed's does, the stream dropout and a dataset's random
transforms draw from: the batches are read in DeepSpeed's ``2 x device_count`` worker processes
per rank (the GPUs this rank sees; 1 without one), which draw their random numbers from a seed the DataLoader
takes from the global RNG at ``iter(loader)`` (DeepSpeed's ``(x for x in loader)`` starts the
iterator there: a generator expression evaluates its source at once).

Why a pass resumes at another world size: rank r's micro-batch b holds the positions
``world_size * (b * micro + i) + r`` of the pass's order, so the ranks' micro-batches b together are
the positions ``[b, b + 1) * micro * world_size``, and an optimizer step of ``train_batch_size``
samples is the next ``train_batch_size`` positions of one order that does not depend on the world
size. A checkpoint keeps the position reached in the pass (``position``); ``resume`` starts the next
pass there, split over the new world size the way ``DistributedSampler`` splits a whole one.
"""
from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader, DistributedSampler

ROUTES = ("train", "eval", "predict")


def io_workers() -> int:
    """DeepSpeed's default worker processes a rank, ``2 x device_count``: which worker reads which batch,
    so what a random transform draws, depends on it."""
    return 2 * (torch.cuda.device_count() if torch.cuda.is_available() else 1)


class EngineSampler(DistributedSampler):
    """``DistributedSampler``'s indices for this rank; after ``resume(start)`` the next pass begins at `start`."""

    def __init__(self, dataset, num_replicas: int, rank: int, shuffle: bool = True, seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.start = 0  # positions of the pass's order already consumed before a resume

    def resume(self, start: int) -> None:
        """The next pass skips the first `start` positions of its order (none once they cover the dataset)."""
        self.start = start if 0 < start < len(self.dataset) else 0

    def _rest(self) -> list[int]:
        """This pass's order from ``start`` on, cut or padded to a multiple of the world size like torch's."""
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(len(self.dataset), generator=generator).tolist()
        else:
            order = list(range(len(self.dataset)))
        rest = order[self.start:]
        if self.drop_last:
            return rest[:len(rest) // self.num_replicas * self.num_replicas]
        padding = -len(rest) % self.num_replicas
        return rest + (rest * math.ceil(padding / len(rest)))[:padding]

    def __iter__(self):
        if self.start == 0:  # torch's own, so that the order is DistributedSampler's by construction
            return super().__iter__()
        rest = self._rest()
        self.start = 0
        return iter(rest[self.rank::self.num_replicas])

    def __len__(self) -> int:
        return super().__len__() if self.start == 0 else len(self._rest()) // self.num_replicas


class EngineDataLoader:
    """DeepSpeed's ``DeepSpeedDataLoader``: a fresh DataLoader per pass over ``data_sampler``.

    It also counts the micro-batches of the current pass, so that a checkpoint knows where the pass
    stands (``position``) and a resumed run continues there (``resume``).
    """

    def __init__(self, dataset, batch_size: int, data_sampler, world_size: int, collate_fn=None,
                 drop_last: bool = False, pin_memory: bool = False, num_workers: int | None = None):
        self.dataset, self.batch_size, self.data_sampler = dataset, batch_size, data_sampler
        self.world_size, self.collate_fn, self.drop_last = world_size, collate_fn, drop_last
        self.pin_memory, self.num_workers = pin_memory, io_workers() if num_workers is None else num_workers
        self._batches = None
        self._pass_start = 0  # where the current pass began in its order (not 0 after a resume)
        self._taken = 0       # micro-batches of the current pass handed out

    @property
    def sampler(self):
        return self.data_sampler

    def __len__(self) -> int:
        count = len(self.data_sampler) / self.batch_size
        return math.floor(count) if self.drop_last else math.ceil(count)

    def __iter__(self):
        self._pass_start = getattr(self.data_sampler, "start", 0)
        self._taken = 0
        loader = DataLoader(self.dataset, batch_size=self.batch_size, sampler=self.data_sampler,
                            collate_fn=self.collate_fn, drop_last=self.drop_last, pin_memory=self.pin_memory,
                            num_workers=self.num_workers)
        self._batches = iter(loader)  # here, as DeepSpeed's: the workers' seed is drawn now, not at next()
        return self

    def __next__(self):
        if self._batches is None:
            raise TypeError("EngineDataLoader: iterate it (for batch in loader / iter(loader)) before next()")
        batch = next(self._batches)
        self._taken += 1
        return batch

    def position(self) -> dict:
        """Where the current pass stands, in positions of its order (the same for every rank), and its epoch."""
        reached = self._pass_start + self._taken * self.batch_size * self.world_size
        return {"epoch": getattr(self.data_sampler, "epoch", 0),
                "start": reached if reached < len(self.dataset) else 0}

    def resume(self, position: dict) -> None:
        """The next pass continues the checkpointed one (``position()``), at this world size."""
        if not hasattr(self.data_sampler, "resume"):
            return  # a sampler of the script's own (deepspeed_io(data_sampler=...)) keeps its own position
        self.data_sampler.set_epoch(position.get("epoch", 0))
        self.data_sampler.resume(position.get("start", 0))
        self._pass_start, self._taken = self.data_sampler.start, 0  # a save before the next pass keeps it


def build_dataloader(dataset, config, dist_context, collate_fn=None, *, batch_size=None, data_sampler=None,
                     route: str = "train", num_workers=None, pin_memory: bool | None = None) -> EngineDataLoader:
    """The loader DeepSpeed's ``deepspeed_io`` builds: this data rank's ``DistributedSampler`` share in micro-batches.

    Training shuffles (seed 0), evaluation and prediction do not. `num_workers`: worker processes
    a rank (DeepSpeed's 2 x the GPUs the rank sees, 2 without one, unless given; 0 reads in the rank, whose random transforms then draw from
    the rank's RNG, dropout's). `pin_memory`: page-locked batches for faster copies to a GPU
    (default: on when training on one).
    """
    on_gpu = dist_context.device.type == "cuda" and torch.cuda.is_available()
    if data_sampler is None:
        data_sampler = EngineSampler(dataset, dist_context.world_size, dist_context.rank, shuffle=route == "train")
    return EngineDataLoader(dataset, batch_size or config.train_micro_batch_size_per_gpu, data_sampler,
                            dist_context.world_size, collate_fn=collate_fn, drop_last=config.dataloader_drop_last,
                            pin_memory=on_gpu if pin_memory is None else bool(pin_memory) and torch.cuda.is_available(),
                            num_workers=num_workers)


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

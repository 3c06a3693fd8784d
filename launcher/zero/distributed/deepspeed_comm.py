"""``deepspeed.comm``: DeepSpeed's collective API over torch.distributed.

The calls scripts make are spelled out (DeepSpeed's extra keywords such as ``prof`` and
``log_name`` are accepted and ignored); any other name is torch.distributed's own.
"""
from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed as _dist
from torch.distributed import ReduceOp  # noqa: F401  (deepspeed.comm.ReduceOp)

from launcher.zero.distributed.context import init_distributed as start

def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True,
                     distributed_port: int = 29500, verbose: bool = True, timeout: timedelta | None = None,
                     init_method: str | None = None, dist_init_required: bool | None = None, config=None,
                     rank: int = -1, world_size: int = -1, *, backend: str | None = None):
    """DeepSpeed's signature; starts the group from dslaunch's env (or reuses the one running).

    ``auto_mpi_discovery``, ``distributed_port``, ``init_method``, ``rank`` and ``world_size``
    are for DeepSpeed's own launch paths: dslaunch sets RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT for every rank, and those are what is used.
    """
    timeout_s = timeout.total_seconds() if timeout is not None else 1800.0
    return start(backend=dist_backend or backend, timeout_s=timeout_s)


def is_initialized() -> bool:
    return _dist.is_available() and _dist.is_initialized()


def get_rank(group=None) -> int:
    return _dist.get_rank(group) if is_initialized() else int(os.environ.get("RANK", 0))


def get_world_size(group=None) -> int:
    return _dist.get_world_size(group) if is_initialized() else int(os.environ.get("WORLD_SIZE", 1))


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def get_world_group():
    return _dist.group.WORLD


def barrier(group=None, async_op: bool = False, device_ids=None, **kwargs):
    return _dist.barrier(group=group, async_op=async_op, device_ids=device_ids)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, **kwargs):
    return _dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op: bool = False, **kwargs):
    return _dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)


def broadcast(tensor, src, group=None, async_op: bool = False, **kwargs):
    return _dist.broadcast(tensor, src, group=group, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op: bool = False, **kwargs):
    return _dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_into_tensor(output_tensor, tensor, group=None, async_op: bool = False, **kwargs):
    return _dist.all_gather_into_tensor(output_tensor, tensor, group=group, async_op=async_op)


def reduce_scatter_tensor(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op: bool = False, **kwargs):
    return _dist.reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None, group=None,
                      async_op: bool = False, **kwargs):
    return _dist.all_to_all_single(output, tensor, output_split_sizes, input_split_sizes, group=group,
                                   async_op=async_op)


def send(tensor, dst, group=None, tag: int = 0, **kwargs):
    return _dist.send(tensor, dst, group=group, tag=tag)


def recv(tensor, src=None, group=None, tag: int = 0, **kwargs):
    return _dist.recv(tensor, src, group=group, tag=tag)


def log_summary(show_straggler: bool = False) -> None:
    """DeepSpeed prints its communication profile here; this engine keeps none."""


def __getattr__(name: str):
    value = getattr(_dist, name, None)
    if value is None:
        raise AttributeError(f"module 'launcher.zero.comm' (deepspeed.comm) has no attribute '{name}'")
    return value

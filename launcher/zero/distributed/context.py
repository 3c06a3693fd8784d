"""The distributed context: the process group and this rank's place in it.

``init_distributed`` turns the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), which ``zero.initialize`` reads once and passes in, into a process group; the
training step and the strategies below it receive a DistContext and read no environment. (Other
readers: DeepSpeed's ``comm`` and ``accelerator`` helpers before a group exists, ``log``'s rank,
and the ``DSLAUNCH_CPU_ADAM_THREADS`` / ``DS_ACCELERATOR`` knobs.)
"""
from __future__ import annotations

import atexit
import gc
import os
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping

import torch
import torch.distributed as dist

from launcher.zero.errors import DistributedSetupError
from launcher.zero.failure import install_from_env

try:
    # Imported here, before any process group exists, on purpose. This module binds
    # ``group=group.WORLD`` as default arguments when it is first imported, and torch imports it
    # lazily (torch.optim's first step imports torch._dynamo, which imports it). Imported after
    # init_process_group, its defaults keep the default group alive past destroy_process_group:
    # the gloo worker/loop threads (and rank 0's TCPStore server) then survive our atexit teardown
    # and the group is destroyed only by the garbage collector inside interpreter finalization,
    # with those threads still running (the suspected cause of rare SIGABRTs of ranks at exit).
    import torch.distributed.nn.functional  # noqa: F401
except ImportError:  # a torch build without it cannot capture the group either
    pass


@dataclass(frozen=True)
class DistContext:
    """A process group and this rank's coordinates in it; ``device`` is where tensors live."""

    group: Any
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    local_world_size: int = 1     # ranks on this node (LOCAL_WORLD_SIZE), for memory advice


def context_from_group(group: Any = None, device: torch.device | str | None = None,
                       local_rank: int = 0, local_world_size: int = 1) -> DistContext:
    """A DistContext over an existing process group (None: the default group)."""
    backend = dist.get_backend(group)
    if device is None:
        device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    return DistContext(group=group, rank=dist.get_rank(group), world_size=dist.get_world_size(group),
                       local_rank=local_rank, device=torch.device(device), backend=backend,
                       local_world_size=local_world_size)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_distributed(backend: str | None = None, env: Mapping[str, str] | None = None,
                     timeout_s: float = 1800.0) -> DistContext:
    """Start torch.distributed from the launcher's env (NCCL on GPU, gloo on CPU), or reuse it.

    Without RANK/WORLD_SIZE in the environment this is a single process: a one-rank gloo/NCCL
    group on a free local port, so that every code path is the same.
    """
    env = os.environ if env is None else env
    install_from_env(env)   # deepspeed.init_distributed is an entry point of its own
    local_rank = int(env.get("LOCAL_RANK", "0") or 0)
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
    use_cuda = torch.cuda.is_available() and (backend in (None, "nccl"))
    if use_cuda:
        torch.cuda.set_device(local_rank % max(1, torch.cuda.device_count()))
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    if dist.is_available() and dist.is_initialized():
        # the script started the group itself; still end it before interpreter finalization,
        # where gloo's threads dying with the group abort the process ("terminate called ...")
        _destroy_at_exit()
        return context_from_group(None, device=device, local_rank=local_rank, local_world_size=local_world_size)
    backend = backend or ("nccl" if use_cuda else "gloo")
    timeout = timedelta(seconds=timeout_s)
    if "RANK" in env and "WORLD_SIZE" in env:
        try:
            rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        except ValueError:
            raise DistributedSetupError(f"RANK={env['RANK']!r} / WORLD_SIZE={env['WORLD_SIZE']!r} are not integers",
                                        hint="start the script with dslaunch") from None
        missing = [key for key in ("MASTER_ADDR", "MASTER_PORT") if not env.get(key)]
        if missing:
            raise DistributedSetupError(f"{', '.join(missing)} not set (RANK and WORLD_SIZE are)",
                                        hint="start the script with dslaunch, or export MASTER_ADDR and MASTER_PORT")
        init_method = f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    else:
        rank, world_size = 0, 1
        init_method = f"tcp://127.0.0.1:{_free_port()}"
    dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timeout)
    _destroy_at_exit()  # we started it, so we end it (NCCL warns about leaked groups otherwise)
    return context_from_group(None, device=device, local_rank=local_rank, local_world_size=local_world_size)


_DESTROY_REGISTERED = []


def _destroy_at_exit() -> None:
    if not _DESTROY_REGISTERED:
        _DESTROY_REGISTERED.append(True)
        atexit.register(_destroy)


def _destroy() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # at interpreter exit a broken peer must not turn into a traceback
            pass
    # also where the script destroyed the group itself: the captured defaults still hold it
    _drop_captured_groups()
    gc.collect()   # the group's threads end here, not in interpreter finalization


def _drop_captured_groups() -> None:
    """Free the process groups torch.distributed.nn.functional captured in its default arguments.

    Imported after init_process_group (a script that starts the group itself, then lets torch.optim
    import torch._dynamo), that module binds ``group=group.WORLD`` into its functions' defaults. The
    group then outlives destroy_process_group, ours or the script's, and its gloo threads die only
    in interpreter finalization, where they can abort the rank ("terminate called without an active
    exception"; seen once in a loaded CI run, tests/dist/test_onebit_engine.py).
    """
    module = sys.modules.get("torch.distributed.nn.functional")
    if module is None or not dist.is_available():
        return
    for value in list(vars(module).values()):
        defaults = getattr(value, "__defaults__", None)
        if defaults and any(isinstance(item, dist.ProcessGroup) for item in defaults):
            value.__defaults__ = tuple(None if isinstance(item, dist.ProcessGroup) else item for item in defaults)

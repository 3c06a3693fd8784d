"""From a node's part of the plan to the rank processes it starts (on that node)."""
from __future__ import annotations

import os
from typing import Sequence

from launcher.node.netinfo import interface_toward
from launcher.node.process import RankSpec
from launcher.planning.plan import RankPlan

IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def runtime_env(plan_env: dict[str, str], inherited: dict[str, str], local_world_size: int,
                ifname: str | None, cpu_count: int) -> dict[str, str]:
    """A rank's full environment: inherited, then the plan's, then per-node defaults.

    The defaults apply only where neither the user's shell nor the plan set them:
    the interface toward MASTER_ADDR for gloo and NCCL, and an even share of the
    cores for OpenMP so CPU ranks do not oversubscribe the node.
    """
    env = dict(inherited)
    env.update(plan_env)
    if ifname:
        for name in IFNAME_VARIABLES:
            env.setdefault(name, ifname)
    env.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count // max(1, local_world_size))))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def visible_devices(slot_ids: str, node_visible: str | None) -> str:
    """Slot ids are positions in the node's own CUDA_VISIBLE_DEVICES when it has one.

    A scheduler (Slurm without device cgroups, a container runtime) may give a node
    GPUs 2,3: slot 0 is then GPU 2, never GPU 0.
    """
    if not node_visible:
        return slot_ids
    devices = [d.strip() for d in node_visible.split(",") if d.strip()]
    picked = []
    for slot in slot_ids.split(","):
        if not slot.isdigit() or int(slot) >= len(devices):
            return slot_ids
        picked.append(devices[int(slot)])
    return ",".join(picked)


def rank_specs(ranks: Sequence[RankPlan], master_addr: str, workdir: str, inherited: dict[str, str],
               remap_devices: bool = False, cores: Sequence[int] = ()) -> list[RankSpec]:
    """RankSpecs for a node's ranks (an agent reads them with planning.render.ranks_from_json).

    `remap_devices` is for agents on other nodes; on the launching machine the plan's
    slot ids are already this machine's visible GPU ids. `cores` (--bind_cores_to_rank: the
    node's usable cores) are split evenly, in order, by local rank, as DeepSpeed's launcher does.
    """
    ifname = interface_toward(master_addr)
    cpu_count = os.cpu_count() or 1
    specs = []
    for r in ranks:
        env = runtime_env(r.env, inherited, len(ranks), ifname, cpu_count)
        if remap_devices and "CUDA_VISIBLE_DEVICES" in r.env:
            env["CUDA_VISIBLE_DEVICES"] = visible_devices(r.env["CUDA_VISIBLE_DEVICES"],
                                                          inherited.get("CUDA_VISIBLE_DEVICES"))
        bound = core_share(cores, r.local_rank, len(ranks))
        if bound and "OMP_NUM_THREADS" not in r.env and "OMP_NUM_THREADS" not in inherited:
            env["OMP_NUM_THREADS"] = str(len(bound))
        specs.append(RankSpec(rank=r.rank, local_rank=r.local_rank, argv=tuple(r.argv), env=env, cwd=workdir,
                              cores=bound))
    return specs


def core_share(cores: Sequence[int], local_rank: int, local_world_size: int) -> tuple[int, ...]:
    """Local rank i's even share of ``cores`` (in order); every core when there are fewer cores than ranks."""
    cores = sorted(cores)
    if not cores:
        return ()
    per = len(cores) // max(1, local_world_size)
    if per == 0:
        return tuple(cores)
    return tuple(cores[local_rank * per:(local_rank + 1) * per])

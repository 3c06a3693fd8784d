"""From a node's part of the plan to the rank processes it starts (on that node)."""
from __future__ import annotations

import os

from launcher.netinfo import interface_toward
from launcher.process import RankSpec

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


def rank_specs(node: dict, master_addr: str, workdir: str, inherited: dict[str, str]) -> list[RankSpec]:
    """RankSpecs for a node given as its JSON form (see planjson.node_to_json)."""
    ranks = node["ranks"]
    ifname = interface_toward(master_addr)
    cpu_count = os.cpu_count() or 1
    return [RankSpec(rank=r["rank"], local_rank=r["local_rank"], argv=tuple(r["argv"]),
                     env=runtime_env(r["env"], inherited, len(ranks), ifname, cpu_count), cwd=workdir)
            for r in ranks]

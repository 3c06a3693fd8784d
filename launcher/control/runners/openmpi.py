"""The OpenMPI runner: mpirun starts one agent per node (`-H host:1,...`).

Each agent learns its node rank from OMPI_COMM_WORLD_RANK; the agent then starts
that node's ranks itself, so --include/--exclude work here too (DeepSpeed refuses
them with openmpi). `--bind-to none` keeps the ranks from inheriting one core.
"""
from __future__ import annotations

import os
import shlex

from launcher.control.runners.base import ControlEndpoint, agent_argv, one_command_for_all
from launcher.handshake import SECRET_ENV
from launcher.planning.plan import JobPlan


def command(plan: JobPlan, endpoint: ControlEndpoint, as_root: bool | None = None) -> list[str]:
    as_root = (os.geteuid() == 0) if as_root is None else as_root
    hosts = ",".join(f"{n.ssh_target}:1" for n in plan.nodes)
    argv = ["mpirun"] + (["--allow-run-as-root"] if as_root else [])
    argv += ["-np", str(len(plan.nodes)), "-H", hosts, "--bind-to", "none", "--wdir", plan.workdir]
    ports = {n.ssh_port for n in plan.nodes if n.ssh_port}
    ssh_args = "-o BatchMode=yes" + (f" -p {ports.pop()}" if len(ports) == 1 else "")
    argv += ["--mca", "plm_rsh_args", ssh_args]
    argv += ["-x", SECRET_ENV]   # the agent's key, through mpirun's own channel (not a command line)
    argv += shlex.split(plan.launcher_args)
    return argv + agent_argv(plan, endpoint, "env:OMPI_COMM_WORLD_RANK", SECRET_DELIVERY)


def render(plan: JobPlan, endpoint: ControlEndpoint) -> list[list[str]]:
    return one_command_for_all(plan, command(plan, endpoint))


LABEL = "mpirun"   # how the controller names this runner's process
SECRET_DELIVERY = "env"   # $DSLAUNCH_AGENT_SECRET in mpirun's environment, exported with -x
PER_NODE = False   # one process starts every node (ssh.py: one per node)

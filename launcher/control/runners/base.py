"""What every runner shares: the agent command line and the runner registry."""
from __future__ import annotations

import shlex

from launcher.handshake import agent_secret_args
from launcher.planning.plan import JobPlan
from launcher.wire import ControlEndpoint


def agent_argv(plan: JobPlan, endpoint: ControlEndpoint, node_rank: str, delivery: str) -> list[str]:
    """The per-node agent's argv; `node_rank` may be a literal, '%n' (pdsh) or 'env:VAR'.

    `delivery` (the runner's SECRET_DELIVERY) says where the agent finds its key: never on
    this line, except pdsh's one-time ticket (launcher/handshake.py)."""
    return [plan.python, "-u", "-m", "launcher.agent", "--connect", endpoint.address(),
            *agent_secret_args(delivery, endpoint.ticket), "--node-rank", node_rank]


def remote_shell_command(plan: JobPlan, argv: list[str]) -> str:
    """The one shell line run on a node: cd to the workdir, then exec the agent."""
    return f"cd {shlex.quote(plan.workdir)} && exec {shlex.join(argv)}"


def get_runner(name: str):
    """The runner module for a launcher name (imported lazily: they are small)."""
    import importlib
    return importlib.import_module(f"launcher.control.runners.{name}")


def one_command_for_all(plan: JobPlan, command: list[str]) -> list[list[str]]:
    """For runners whose single process (pdsh, mpirun, srun) starts every node's agent."""
    return [list(command) for _ in plan.nodes]

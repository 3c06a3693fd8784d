"""The pdsh runner: `pdsh -R ssh -w h0,h1 ...`; pdsh's %n gives each node its rank.

pdsh keeps the -w order, so node rank = hostfile order. PDSH_SSH_ARGS_APPEND is
appended to, never replaced (DeepSpeed #4370).
"""
from __future__ import annotations

import shlex

from launcher.control.runners.base import ControlEndpoint, agent_argv, one_command_for_all, remote_shell_command
from launcher.errors import UsageError
from launcher.planning.plan import JobPlan


def _ssh_args(plan: JobPlan, environ: dict[str, str]) -> str:
    ports = {n.ssh_port for n in plan.nodes}
    if len(ports) > 1:
        raise UsageError("pdsh cannot use a different ssh port per host: " + ", ".join(
            f"{n.host}:{n.ssh_port or 22}" for n in plan.nodes), hint="use --launcher ssh")
    extra = "-o BatchMode=yes" + (f" -p {ports.pop()}" if ports and None not in ports else "")
    old = environ.get("PDSH_SSH_ARGS_APPEND", "").strip()
    return f"{old} {extra}".strip()


def command(plan: JobPlan, endpoint: ControlEndpoint) -> list[str]:
    _ssh_args(plan, {})  # refuse what pdsh cannot do before anything starts
    hosts = ",".join(n.ssh_target for n in plan.nodes)
    line = remote_shell_command(plan, agent_argv(plan, endpoint, "%n", SECRET_DELIVERY))
    return ["pdsh", "-S", "-R", "ssh", "-f", str(max(1024, len(plan.nodes))), "-w", hosts, *shlex.split(plan.launcher_args), line]


def render(plan: JobPlan, endpoint: ControlEndpoint) -> list[list[str]]:
    return one_command_for_all(plan, command(plan, endpoint))


def runner_env(plan: JobPlan, environ: dict[str, str]) -> dict[str, str]:
    return {**environ, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND": _ssh_args(plan, environ)}


LABEL = "pdsh"   # how the controller names this runner's process
SECRET_DELIVERY = "ticket"   # pdsh has no per-node stdin: a one-time ticket, once per node, from its address
PER_NODE = False   # one process starts every node (ssh.py: one per node)

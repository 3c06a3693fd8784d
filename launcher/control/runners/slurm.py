"""The Slurm runner: inside an allocation, `srun` starts one agent per node.

Agents take their node rank from SLURM_NODEID; the nodes are the allocation's, in
its order (expanded from SLURM_JOB_NODELIST), so MASTER_ADDR is its first node.
"""
from __future__ import annotations

import re
import shlex

from launcher.control.runners.base import ControlEndpoint, agent_argv, one_command_for_all
from launcher.errors import UsageError
from launcher.handshake import SECRET_ENV
from launcher.planning.plan import JobPlan


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list: 'gn[01-03,7],login' -> gn01, gn02, gn03, gn7, login."""
    hosts: list[str] = []
    for item in _split_top(text):
        match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", item)
        if not match:
            if item:
                hosts.append(item)
            continue
        prefix, ranges, rest = match.groups()
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise UsageError(f"cannot read Slurm host list '{text}'")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                for tail in expand_hostlist(rest) if rest else [""]:
                    hosts.append(f"{prefix}{number:0{width}d}{tail}")
    return hosts


def _split_top(text: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in text:
        if char == "," and depth == 0:
            items.append(current.strip())
            current = ""
            continue
        depth += char == "["
        depth -= char == "]"
        current += char
    items.append(current.strip())
    return items


def allocation_slots(environ: dict[str, str], num_nodes: int) -> list[int]:
    """Slots of each allocated node: GPUs on the node, else the tasks Slurm gave it, else 1."""
    gpus = environ.get("SLURM_GPUS_ON_NODE", "")
    if gpus.isdigit() and int(gpus) > 0:
        return [int(gpus)] * num_nodes
    tasks = expand_tasks_per_node(environ.get("SLURM_TASKS_PER_NODE", ""))
    if len(tasks) == num_nodes:
        return tasks
    per_node = environ.get("SLURM_NTASKS_PER_NODE", "")
    if per_node.isdigit() and int(per_node) > 0:
        return [int(per_node)] * num_nodes
    return [1] * num_nodes


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's '2(x3),1' -> [2, 2, 2, 1]; anything unreadable -> []."""
    counts: list[int] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item)
        if not match:
            return []
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def _check_export(user_args: list[str]) -> None:
    """The agents' key travels in srun's environment: a narrowing --export must keep it."""
    for index, arg in enumerate(user_args):
        if arg == "--export" or arg.startswith("--export="):
            value = arg.partition("=")[2] or (user_args[index + 1] if index + 1 < len(user_args) else "")
            names = value.split(",")
            if "ALL" not in names and SECRET_ENV not in names:
                raise UsageError(f"--launcher_args '{arg}' would keep the agents' key (${SECRET_ENV}) "
                                 "from reaching them", hint=f"add it: --export={value},{SECRET_ENV}")


def command(plan: JobPlan, endpoint: ControlEndpoint) -> list[str]:
    _check_export(shlex.split(plan.launcher_args))
    nodes = ",".join(n.host for n in plan.nodes)
    argv = ["srun", "--nodes", str(len(plan.nodes)), "--ntasks", str(len(plan.nodes)),
            "--ntasks-per-node", "1", "--nodelist", nodes, "--chdir", plan.workdir,
            *shlex.split(plan.launcher_args)]
    return argv + agent_argv(plan, endpoint, "env:SLURM_NODEID", SECRET_DELIVERY)


def render(plan: JobPlan, endpoint: ControlEndpoint) -> list[list[str]]:
    return one_command_for_all(plan, command(plan, endpoint))


LABEL = "srun"   # how the controller names this runner's process
SECRET_DELIVERY = "env"   # $DSLAUNCH_AGENT_SECRET in srun's environment (srun exports it to the tasks)
PER_NODE = False   # one process starts every node (ssh.py: one per node)

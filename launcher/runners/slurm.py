"""The Slurm runner: inside an allocation, `srun` starts one agent per node.

Agents take their node rank from SLURM_NODEID; the nodes are the allocation's, in
its order (expanded from SLURM_JOB_NODELIST), so MASTER_ADDR is its first node.
"""
from __future__ import annotations

import os
import re
import shlex

from launcher.controller import launch_one_runner
from launcher.errors import UsageError
from launcher.plan import JobPlan
from launcher.runners.base import ControlEndpoint, agent_argv


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


def allocation_slots(environ: dict[str, str]) -> int:
    """Slots per node in the allocation: GPUs on the node, else tasks per node, else 1."""
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE"):
        value = environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def command(plan: JobPlan, endpoint: ControlEndpoint) -> list[str]:
    nodes = ",".join(n.host for n in plan.nodes)
    argv = ["srun", "--nodes", str(len(plan.nodes)), "--ntasks", str(len(plan.nodes)),
            "--ntasks-per-node", "1", "--nodelist", nodes, "--chdir", plan.workdir,
            *shlex.split(plan.launcher_args)]
    return argv + agent_argv(plan, endpoint, "env:SLURM_NODEID")


def render(plan: JobPlan, endpoint: ControlEndpoint) -> list[list[str]]:
    full = command(plan, endpoint)
    return [full for _ in plan.nodes]


def launch(plan: JobPlan) -> int:
    return launch_one_runner(plan, "srun", command, dict(os.environ))

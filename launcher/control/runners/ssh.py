"""The ssh runner: the system OpenSSH client, one connection per node.

Honours ~/.ssh/config, the agent and known_hosts as the user's own ssh does;
BatchMode=yes so it never prompts. The remote command holds no env values: they
travel over the control channel.
"""
from __future__ import annotations


from launcher.control.runners.base import ControlEndpoint, agent_argv, remote_shell_command
from launcher.planning.plan import JobPlan, NodePlan

SECRET_DELIVERY = "stdin"   # the agent reads its node's key from the ssh connection's standard input
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")


def node_command(plan: JobPlan, node: NodePlan, endpoint: ControlEndpoint) -> list[str]:
    argv = ["ssh", *SSH_OPTIONS]
    if node.ssh_port:
        argv += ["-p", str(node.ssh_port)]
    agent = agent_argv(plan, endpoint, str(node.node_rank), SECRET_DELIVERY)
    return argv + [node.ssh_target, remote_shell_command(plan, agent)]


def render(plan: JobPlan, endpoint: ControlEndpoint) -> list[list[str]]:
    return [node_command(plan, node, endpoint) for node in plan.nodes]


LABEL = "ssh"
PER_NODE = True   # one ssh process per node (the others start every node from one process)

"""Which processes on this machine belong to the dslaunch job a test started.

The test cluster's nodes are network namespaces that share this machine's pid space, so /proc
shows every process of every node, and also those of any other dslaunch job on the machine (a
chaos run on its own cluster, dsl-chaos-nK). A test that scans processes looks at its own job
only: the process tree it started (dslaunch, salloc, ssh, pdsh, mpirun) plus what runs inside the
default cluster's namespaces dsl-nK (sshd children, orted, slurmd's tasks, agents, ranks), which
one test at a time uses (the cluster lock). Its agents are the ones that dial back to a port its
own tree listens on.
"""
from __future__ import annotations

import os
import re

import psutil

NETNS_DIR = "/run/netns"
AGENT = ["-u", "-m", "launcher.agent"]


def cluster_namespaces(prefix: str = "dsl-n") -> set[str]:
    """The `net:[inode]` names of the cluster's node namespaces (/run/netns/dsl-n1, ...)."""
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return set()
    pattern = re.compile(re.escape(prefix) + r"\d+")
    return {f"net:[{os.stat(os.path.join(NETNS_DIR, name)).st_ino}]"
            for name in names if pattern.fullmatch(name)}


def netns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def tree(root: int) -> list[psutil.Process]:
    """`root` and every process below it (empty once it has exited)."""
    try:
        top = psutil.Process(root)
        return [top, *top.children(recursive=True)]
    except psutil.Error:
        return []


def job_command_lines(root: int) -> dict[int, list[str]]:
    """pid -> argv of the processes of the job under `root`: its tree plus the cluster's nodes."""
    spaces = cluster_namespaces()
    mine = {p.pid for p in tree(root)}
    found = {}
    for process in psutil.process_iter(["cmdline"]):
        argv = process.info["cmdline"]
        if argv and (process.pid in mine or netns_of(process.pid) in spaces):
            found[process.pid] = argv
    return found


def listening_ports(root: int) -> set[int]:
    """The TCP ports that `root` or a process below it listens on (dslaunch's control channel)."""
    ports = set()
    for process in tree(root):
        try:
            ports |= {c.laddr.port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return ports


def connect_port(argv: list[str]) -> int | None:
    """The port of an agent's `--connect HOST:PORT`."""
    if "--connect" not in argv[:-1]:
        return None
    return int(argv[argv.index("--connect") + 1].rsplit(":", 1)[1])


def job_agents(root: int, lines: dict[int, list[str]] | None = None) -> dict[int, list[str]]:
    """The agents of the job under `root` (mpirun's and pdsh's own argv name the agent too)."""
    lines = job_command_lines(root) if lines is None else lines
    ports = listening_ports(root)
    return {pid: argv for pid, argv in lines.items()
            if argv[1:4] == AGENT and connect_port(argv) in ports}

"""How many files a launch keeps open, checked against the process's fd limit before anything starts.

The ssh runner keeps one ssh process per node, and the controller holds its output pipe, its
stdin pipe while the key is written, and the agent's control socket: a few fds per node. At a
few hundred nodes that passes the common soft limit of 1024, and Python would fail mid-launch
with a bare ``OSError: [Errno 24]``. Pure: the limits come in, a new soft limit or a typed error
goes out; the caller (launch.py) reads and sets the limit.
"""
from __future__ import annotations

from launcher.errors import LaunchError

FDS_PER_NODE = 4    # ssh's output pipe, its stdin pipe, the agent's control socket, one spare
FDS_BASE = 64       # the controller's own: listening socket, console, log files, Python's


def fds_needed(node_count: int, per_node: int = FDS_PER_NODE) -> int:
    """Open files the controller needs at once for a job of `node_count` nodes."""
    return FDS_BASE + per_node * node_count


def soft_limit_for(node_count: int, soft: int, hard: int, per_node: int = FDS_PER_NODE) -> int:
    """The soft fd limit to run with: the current one when it is enough, else raised toward the
    hard limit (an unprivileged process may do that); a LaunchError when even the hard one is short.

    A negative limit means unlimited (RLIM_INFINITY)."""
    need = fds_needed(node_count, per_node)
    if soft < 0 or soft >= need:
        return soft
    if hard < 0 or hard >= need:
        return need
    raise LaunchError(
        f"{node_count} nodes need about {need} open files in the controller, "
        f"but this process may open at most {hard} (ulimit -n hard limit)",
        hint=f"raise it (ulimit -Hn {need}; ulimit -n {need}, or nofile in /etc/security/limits.conf), "
             f"or use --launcher pdsh, which keeps one process for all nodes")

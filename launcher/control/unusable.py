"""Which nodes could not take part in a restart, and why: from the preflight report when there is
one, else from the runner's last line (pure; the controller raises NodesUnusable with these)."""
from __future__ import annotations

from launcher.control.outcome import NodeTrouble
from launcher.planning.plan import JobPlan


def from_report(plan: JobPlan, report) -> tuple[NodeTrouble, ...]:
    """Every node whose preflight failed, with its first failed check ("ssh: connection refused")."""
    troubles = []
    for node in plan.nodes:
        host = report.host(node.host)
        if host is None or host.ok:
            continue
        check = next(c for c in host.checks if not c.ok)
        troubles.append(NodeTrouble(node.node_rank, node.host, f"{check.name}: {check.detail}".rstrip(": ")))
    return tuple(troubles)


def at_startup(plan: JobPlan, node_ranks: list[int], problem: str, report=None) -> tuple[NodeTrouble, ...]:
    """The nodes whose agent did not start: the preflight's reasons, else the runner's last line."""
    if report is not None and not report.ok:
        return from_report(plan, report)
    lines = [line.strip() for line in problem.splitlines() if line.strip()]
    reason = lines[-1] if len(lines) > 1 else "its agent did not start"
    return tuple(NodeTrouble(r, plan.nodes[r].host, reason) for r in node_ranks)

"""The local runner: every rank on this machine, started in-process (control/local_job.py), no agent."""
from __future__ import annotations

from launcher.planning.plan import JobPlan
from launcher.wire import ControlEndpoint


def render(plan: JobPlan, endpoint: ControlEndpoint | None = None) -> list[list[str]]:
    """Local ranks are started directly: the node command is empty, the ranks' argv is exact."""
    return [[] for _ in plan.nodes]


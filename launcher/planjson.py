"""The plan's JSON form: the `--dry-run --json` document and what agents receive."""
from __future__ import annotations

from launcher.plan import JobPlan, NodePlan


def node_to_json(node: NodePlan, command: list[str] | None = None) -> dict:
    doc = {"host": node.host, "node_rank": node.node_rank, "slots": list(node.slots)}
    if command is not None:
        doc["command"] = list(command)
    doc["ranks"] = [{"rank": r.rank, "local_rank": r.local_rank, "argv": list(r.argv), "env": dict(r.env)}
                    for r in node.ranks]
    return doc


def plan_to_json(plan: JobPlan, commands: list[list[str]]) -> dict:
    """CONTRACT.md's dry-run document, plus a few extra keys (workdir, notes)."""
    return {
        "world_size": plan.world_size,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "launcher": plan.launcher,
        "workdir": plan.workdir,
        "env_files": list(plan.env_files),
        "notes": list(plan.notes),
        "nodes": [node_to_json(node, cmd) for node, cmd in zip(plan.nodes, commands)],
    }

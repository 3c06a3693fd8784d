"""The plan rendered for people and programs: the `--dry-run` text, its `--json` document, and what agents receive."""
from __future__ import annotations

import shlex

from launcher.planning.plan import JobPlan, NodePlan, RankPlan


def node_to_json(node: NodePlan, command: list[str] | None = None) -> dict:
    doc = {"host": node.host, "node_rank": node.node_rank, "slots": list(node.slots)}
    if command is not None:
        doc["command"] = list(command)
    doc["ranks"] = [{"rank": r.rank, "local_rank": r.local_rank, "argv": list(r.argv), "env": dict(r.env)}
                    for r in node.ranks]
    return doc


def ranks_from_json(node: dict) -> tuple[RankPlan, ...]:
    """The ranks of ``node_to_json``'s document, back as RankPlans (what an agent receives)."""
    return tuple(RankPlan(rank=r["rank"], local_rank=r["local_rank"], argv=tuple(r["argv"]), env=dict(r["env"]))
                 for r in node["ranks"])


def plan_to_json(plan: JobPlan, commands: list[list[str]]) -> dict:
    """The dry-run document of docs/reference/cli.md, plus a few extra keys (workdir, notes)."""
    return {
        "world_size": plan.world_size,
        "master_addr": plan.master_addr,
        "master_port": plan.master_port,
        "launcher": plan.launcher,
        "workdir": plan.workdir,
        "env_files": list(plan.env_files),
        "notes": list(plan.notes),
        "nodes": [node_to_json(node, cmd) for node, cmd in zip(plan.nodes, commands)],
        "bind_cores_to_rank": plan.bind_cores,
        "output": plan.output,
        "log_dir": plan.log_dir,
    }


def describe_plan(plan: JobPlan, commands: list[list[str]]) -> str:
    """The human-readable dry-run: nodes, ranks, commands, env."""
    lines = [f"dslaunch plan: {len(plan.nodes)} node(s), world_size {plan.world_size}, launcher {plan.launcher}, "
             f"master {plan.master_addr}:{plan.master_port or '<free port on node 0>'}",
             f"workdir: {plan.workdir}"]
    lines += [f"note: {n}" for n in plan.notes]
    if plan.env_files:
        lines.append("env files: " + ", ".join(plan.env_files))
    for node, command in zip(plan.nodes, commands):
        slots = ",".join(str(s) for s in node.slots)
        lines.append(f"node {node.node_rank}: {node.host} slots {slots} "
                     f"ranks {node.ranks[0].rank}-{node.ranks[-1].rank}")
        if command:
            lines.append(f"  command: {shlex.join(command)}")
        for rank in node.ranks:
            lines.append(f"  rank {rank.rank} (local {rank.local_rank}): {shlex.join(rank.argv)}")
    first = plan.nodes[0].ranks[0].env
    per_rank = {"RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "CROSS_RANK", "CUDA_VISIBLE_DEVICES",
                "LOCAL_WORLD_SIZE", "LOCAL_SIZE"}
    lines.append("env (rank 0; per rank: " + ", ".join(sorted(per_rank)) + "):")
    lines += [f"  {k}={v}" for k, v in first.items()]
    lines.append("set on each node unless already set: GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME "
                 "(the interface toward MASTER_ADDR), OMP_NUM_THREADS (cores / local ranks)")
    lines.append(f"output: {plan.output} (rank lines on this console); "
                 + (f"full logs: {plan.log_dir}/rank_<R>.log on each node" if plan.log_dir else "no --log_dir"))
    if plan.bind_cores:
        lines.append("--bind_cores_to_rank: each rank is bound to an even share of its node's cores, in "
                     "local-rank order; OMP_NUM_THREADS is that share")
    return "\n".join(lines)

"""The restart policy as data, and the plan of the next try (pure: no I/O).

A try that failed is started again with the same plan and a higher restart count; a try that
lost nodes is re-planned on the nodes that remain (`surviving_options`), so ranks, world size
and the master follow from the ordinary planner, preflight included.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from launcher.errors import UsageError
from launcher.planning.plan import JobPlan, LaunchOptions

RESTART_VARIABLES = ("DSLAUNCH_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


@dataclass(frozen=True)
class RestartPolicy:
    """`--max_restarts N` and `--min_nodes M` (None: a lost node ends the job, as without restarts)."""

    max_restarts: int = 0
    min_nodes: int | None = None

    @classmethod
    def from_options(cls, options: LaunchOptions) -> "RestartPolicy":
        if options.max_restarts < 0:
            raise UsageError(f"--max_restarts {options.max_restarts} is negative", hint="give 0 (no restart) or more")
        if options.min_nodes is not None and options.min_nodes < 1:
            raise UsageError(f"--min_nodes {options.min_nodes} must be at least 1")
        return cls(options.max_restarts, options.min_nodes)

    def describe(self, num_nodes: int) -> str:
        if self.max_restarts == 0:
            return "restarts: none (the first failure ends the job)"
        text = f"restarts: up to {self.max_restarts} after a failed rank or a lost node"
        if self.min_nodes is not None:
            text += f"; a lost node is dropped while at least {self.min_nodes} of {num_nodes} node(s) remain"
        else:
            text += "; a lost node ends the job (no --min_nodes)"
        return text

    def to_json(self) -> dict:
        return {"max_restarts": self.max_restarts, "min_nodes": self.min_nodes}


def with_restart_count(plan: JobPlan, count: int) -> JobPlan:
    """The same plan whose ranks see DSLAUNCH_RESTART_COUNT (and torchrun's name) = `count`."""
    values = {name: str(count) for name in RESTART_VARIABLES}
    nodes = tuple(replace(node, ranks=tuple(replace(r, env={**r.env, **values}) for r in node.ranks))
                  for node in plan.nodes)
    return replace(plan, nodes=nodes)


def surviving_options(plan: JobPlan, options: LaunchOptions, lost: set[int]) -> LaunchOptions:
    """Options that plan the same slots on every node of `plan` except the `lost` node ranks.

    The survivors are named with --include (host:slots@...), so the slots chosen the first time
    (by -i/-e/--num_gpus) stay the same; the master moves to the first survivor unless it was given.
    """
    survivors = [node for node in plan.nodes if node.node_rank not in lost]
    if not survivors:
        raise UsageError("no node is left to restart on")
    spec = "@".join(f"{node.host}:{','.join(str(s) for s in node.slots)}" for node in survivors)
    master = options.master_addr
    if master is not None and any(node.host == master for node in plan.nodes if node.node_rank in lost):
        master = None  # the given master was on a lost node: the first survivor's address instead
    return replace(options, include=spec, exclude=None, num_nodes=None, num_gpus=None, master_addr=master)

"""The restart policy as data, and the plan of the next try (pure: no I/O).

A try that failed is started again with the same plan and a higher restart count; a try that
lost nodes is re-planned on the nodes that remain (`surviving_options`), so ranks, world size
and the master follow from the ordinary planner, preflight included. With --standby_hosts a
spare takes a lost node's place (its node rank, as many slots as the lost node had) while any is left.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from launcher.errors import UsageError
from launcher.planning.hostfile import Host
from launcher.planning.plan import JobPlan, LaunchOptions

RESTART_VARIABLES = ("DSLAUNCH_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


@dataclass(frozen=True)
class RestartPolicy:
    """`--max_restarts N`, `--min_nodes M` (None: a lost node ends the job, as without restarts) and
    the `--standby_hosts` spares, by name, in the order they are taken."""

    max_restarts: int = 0
    min_nodes: int | None = None
    standby_hosts: tuple[str, ...] = ()

    @classmethod
    def from_options(cls, options: LaunchOptions, standby: tuple[Host, ...] = ()) -> "RestartPolicy":
        if options.max_restarts < 0:
            raise UsageError(f"--max_restarts {options.max_restarts} is negative", hint="give 0 (no restart) or more")
        if options.min_nodes is not None and options.min_nodes < 1:
            raise UsageError(f"--min_nodes {options.min_nodes} must be at least 1")
        if standby and options.max_restarts == 0:
            raise UsageError("--standby_hosts without --max_restarts: a spare is only used at a restart",
                             hint="add --max_restarts N")
        return cls(options.max_restarts, options.min_nodes, tuple(h.name for h in standby))

    @property
    def drops_nodes(self) -> bool:
        """A lost or unreachable node may leave the job (shrinking, or a spare in its place)."""
        return self.min_nodes is not None or bool(self.standby_hosts)

    def describe(self, num_nodes: int) -> str:
        if self.max_restarts == 0:
            return "restarts: none (the first failure ends the job)"
        text = f"restarts: up to {self.max_restarts} after a failed rank or a lost node"
        if self.min_nodes is not None:
            text += f"; a lost node is dropped while at least {self.min_nodes} of {num_nodes} node(s) remain"
        elif not self.standby_hosts:
            text += "; a lost node ends the job (no --min_nodes)"
        if self.standby_hosts:
            text += f"; standby host(s) {', '.join(self.standby_hosts)} take a lost node's place first"
            if self.min_nodes is None:
                text += " (none left: a lost node ends the job)"
        return text

    def to_json(self) -> dict:
        document = {"max_restarts": self.max_restarts, "min_nodes": self.min_nodes}
        if self.standby_hosts:   # only then: a document without spares stays as it was
            document["standby_hosts"] = list(self.standby_hosts)
        return document


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


def check_standby(hosts: list[Host] | None, standby: list[Host], path: str) -> None:
    """Spares come from a hostfile of their own and must not also be job nodes."""
    if hosts is None:
        raise UsageError("--standby_hosts needs a hostfile: this job runs on this machine only",
                         hint="give --hostfile with the job's nodes")
    names = {h.name for h in hosts}
    both = [h.name for h in standby if h.name in names]
    if both:
        raise UsageError(f"{path}: host(s) {', '.join(both)} also in the hostfile",
                         hint="a spare is a host the job does not use")


def with_standbys(plan: JobPlan, options: LaunchOptions, hosts: list[Host], lost: set[int],
                  spares: list[Host]) -> tuple[list[Host], LaunchOptions, list[Host]]:
    """Hosts and options of the next try when the `lost` node ranks leave: each takes the next spare
    in its place (its node rank, at most the lost node's slot count), the rest are dropped as by
    `surviving_options`; and the spares still left."""
    left = list(spares)
    in_place = {node.host: left.pop(0) for node in plan.nodes if node.node_rank in lost and left}
    slots = {node.host: node.slots for node in plan.nodes}
    hosts = [in_place.get(h.name, h) for h in hosts]
    spec = []
    for node in plan.nodes:
        if node.host in in_place:
            spare = in_place[node.host]
            spec.append(f"{spare.name}:{','.join(str(s) for s in range(min(spare.slots, len(slots[node.host]))))}")
        elif node.node_rank not in lost:
            spec.append(f"{node.host}:{','.join(str(s) for s in node.slots)}")
    if not spec:
        raise UsageError("no node is left to restart on")
    master = options.master_addr
    if master is not None and any(node.host == master for node in plan.nodes if node.node_rank in lost):
        master = None
    return hosts, replace(options, include="@".join(spec), exclude=None, num_nodes=None, num_gpus=None,
                          master_addr=master), left

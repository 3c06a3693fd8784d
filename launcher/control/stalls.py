"""``--stall_timeout`` across nodes: one StallWatch over every rank of the job, on dslaunch's side.

The agents send their ranks' progress (rank, events, step) when it changes, at most once a
second per node (launcher/node/supervisor.py); dslaunch stamps each reading with its own clock
when it arrives, so the nodes' clocks never meet. Judging here, where every rank is seen, finds
what a node alone cannot: the only rank of a node (``slots=1``) or every rank of one node stuck
(a hung file system, a dead NIC driver) while the other nodes wait for it in a collective.
Pure: readings and the clock come in, a report comes out, once per try (a restart is a new
Controller, hence a new JobStalls).
"""
from __future__ import annotations

from dataclasses import dataclass

from launcher.node.stall import Stall, StallWatch, describe_stall

CHECK_SECONDS = 0.5   # how often the controller asks; 8192 ranks cost about a millisecond a check


@dataclass(frozen=True)
class StuckRank:
    """The rank to name, the node whose agent prints the stacks, and the line that says it."""

    stall: Stall
    node_rank: int
    host: str
    whole_node: bool
    message: str


class JobStalls:
    """Every rank's progress as the agents report it; `check(now)` names a stuck rank once."""

    def __init__(self, timeout_s: float, nodes: dict[int, tuple[str, tuple[int, ...]]]):
        """`nodes`: node rank -> (host, the ranks it runs)."""
        self.timeout_s = timeout_s
        self.watch = StallWatch(timeout_s)
        self.nodes = nodes
        self.node_of = {rank: node_rank for node_rank, (_host, ranks) in nodes.items() for rank in ranks}
        self.reported: StuckRank | None = None
        self._next_check = 0.0

    def report(self, node_rank: int, readings: list, now: float) -> None:
        """One agent's progress message: [[rank, events, step], ...]; readings for another node's ranks are dropped."""
        node_of, observe = self.node_of, self.watch.observe
        for rank, events, step in readings:
            if node_of.get(rank) == node_rank:
                observe(rank, int(events), int(step), now)

    def check(self, now: float) -> StuckRank | None:
        """The stuck rank, the first time one is found (None before, and after: one report a try)."""
        if self.reported is not None or now < self._next_check:
            return None
        self._next_check = now + CHECK_SECONDS
        behind = self.watch.behind(now)
        if not behind:
            return None
        stall = behind[0]
        node_rank = self.node_of[stall.rank]
        host, ranks = self.nodes[node_rank]
        late = {other.rank for other in behind}
        whole_node = len(ranks) > 1 and set(ranks) <= late
        self.reported = StuckRank(stall, node_rank, host, whole_node,
                                  describe_stall(stall, host, self.timeout_s, whole_node))
        return self.reported

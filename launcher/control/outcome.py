"""How one try of a job ended, as data: what the restart loop (control/restarts.py) decides on."""
from __future__ import annotations

from dataclasses import dataclass

from launcher.node.process import RankExit

LOST_BY_DEFAULT = "silent or did not confirm the stop"


@dataclass(frozen=True)
class NodeTrouble:
    """A node that could not take part in a try: which one and why ("ssh: connection refused")."""

    node_rank: int
    host: str
    reason: str


class NodesUnusable(Exception):
    """Raised by the controller, at a restart only, for nodes whose agent could not start or
    whose preflight failed: the restart loop drops them without counting a restart."""

    def __init__(self, troubles: tuple[NodeTrouble, ...]):
        super().__init__(", ".join(f"{t.host} ({t.reason})" for t in troubles))
        self.troubles = troubles


@dataclass(frozen=True)
class Outcome:
    """One try's end: its exit code and why (a rank's failure, lost nodes, a signal, or success)."""

    exit_code: int
    failure: RankExit | None = None          # the first failed rank (rank -1: an agent's error)
    lost: tuple[int, ...] = ()               # node ranks that went silent, whose agent died, or never confirmed the stop
    lost_hosts: tuple[str, ...] = ()
    interrupted: str | None = None           # "SIGINT" / "SIGTERM" when dslaunch itself was stopped
    lost_reasons: tuple[str, ...] = ()       # beside `lost`: "agent died", "silent for 3 s", ...
    unreachable: tuple[NodeTrouble, ...] = ()  # a restart that did not start: nodes that could not take part

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def lost_nodes(self) -> tuple[NodeTrouble, ...]:
        """The lost nodes with their reasons (the default phrase where the controller gave none)."""
        reasons = self.lost_reasons + (LOST_BY_DEFAULT,) * (len(self.lost) - len(self.lost_reasons))
        return tuple(NodeTrouble(r, h, why) for r, h, why in zip(self.lost, self.lost_hosts, reasons))

    def cause(self) -> str:
        """One phrase for the console: which rank or node failed, and how."""
        if self.unreachable:
            return "unreachable at restart: " + ", ".join(f"{t.host} ({t.reason})" for t in self.unreachable)
        if self.lost:
            return ", ".join(f"node {t.node_rank} ({t.host}) lost ({t.reason})" for t in self.lost_nodes())
        if self.failure is not None:
            return self.failure.describe()
        if self.interrupted:
            return f"stopped by {self.interrupted}"
        return f"ended with code {self.exit_code}"

    def signature(self) -> tuple | None:
        """What makes two failures 'the same way': the rank, its exit code and its last line."""
        if self.failure is None:
            return None
        last = next((line for line in reversed(self.failure.tail) if line.strip()), "")
        return (self.failure.rank, self.failure.returncode, last)

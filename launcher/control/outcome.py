"""How one try of a job ended, as data: what the restart loop (control/restarts.py) decides on."""
from __future__ import annotations

from dataclasses import dataclass

from launcher.node.process import RankExit


@dataclass(frozen=True)
class Outcome:
    """One try's end: its exit code and why (a rank's failure, lost nodes, a signal, or success)."""

    exit_code: int
    failure: RankExit | None = None          # the first failed rank (rank -1: an agent's error)
    lost: tuple[int, ...] = ()               # node ranks that went silent or never confirmed the stop
    lost_hosts: tuple[str, ...] = ()
    interrupted: str | None = None           # "SIGINT" / "SIGTERM" when dslaunch itself was stopped

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def cause(self) -> str:
        """One phrase for the console: which rank or node failed, and how."""
        if self.lost:
            names = ", ".join(f"node {r} ({h})" for r, h in zip(self.lost, self.lost_hosts))
            return f"{names} lost (silent or did not confirm the stop)"
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

"""How long dslaunch waits for the agents to connect before it calls the start failed.

A fixed limit for all agents does not fit every size: ssh to 128 nodes from one machine takes
longer than 60 s, yet keeps making progress. So the limit is on silence: the start fails only
when no new agent has connected for `limit` seconds.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StartupWatch:
    limit: float
    since: float          # the start, then the time the latest new agent connected
    connected: int = 0

    def update(self, connected: int, now: float) -> None:
        """`connected` agents have said hello by `now`."""
        if connected > self.connected:
            self.connected, self.since = connected, now

    def stalled(self, now: float) -> bool:
        return now - self.since > self.limit

    def describe(self, missing: str, total: int) -> str:
        return (f"no agent from {missing} after {self.limit:.0f} s in which no new agent connected "
                f"({self.connected} of {total} had)")

"""``--stall_timeout`` across nodes: one watch over every rank of the job, on dslaunch's side.

The agents send their ranks' progress (rank, events, step) when it changes, with how many lines
their ranks printed so far, at most once a second per node (launcher/node/node_watch.py);
dslaunch stamps each reading with its own clock when it arrives, so the nodes' clocks never
meet. Judging here, where every rank is seen, finds what a node alone cannot: the only rank of a
node (``slots=1``) or every rank of one node stuck (a hung file system, a dead NIC driver) while
the other nodes wait for it in a collective; and a job in which no rank moves or prints at all,
whose cause is read from every rank's stack (launcher/node/hang.py). Pure: readings, stacks and
the clock come in, reports come out, once per try (a restart is a new Controller, hence a new
JobStalls).
"""
from __future__ import annotations

from dataclasses import dataclass

from launcher.node.hang import Diagnosis, diagnose
from launcher.node.stacks import RankStack, stack_from_json
from launcher.node.stall import QuietWatch, Stall, StallWatch, describe_stall

CHECK_SECONDS = 0.5   # how often the controller asks; 8192 ranks cost about a millisecond a check
STACKS_WAIT_SECONDS = 10.0   # the agents' stacks (three dumps over a second) that have not come by then are missing


@dataclass(frozen=True)
class StuckRank:
    """The rank to name, the node whose agent prints the stacks, and the line that says it."""

    stall: Stall
    node_rank: int
    host: str
    whole_node: bool
    message: str


@dataclass(frozen=True)
class QuietJob:
    """No rank moved or printed for `quiet_s`: every agent is asked for its ranks' stacks (this
    `round`'s: an answer to an earlier round, which found the job busy, is dropped)."""

    quiet_s: float
    round: int = 1


@dataclass(frozen=True)
class HangVerdict:
    """What the stacks said (one message for the job) and which ranks each node is to stop."""

    diagnosis: Diagnosis
    quiet_s: float
    stops: dict[int, tuple[int, ...]]   # node rank -> its ranks to stop


class JobStalls:
    """Every rank's progress as the agents report it; `check(now)` finds a stuck rank or a quiet job once."""

    def __init__(self, timeout_s: float, nodes: dict[int, tuple[str, tuple[int, ...]]]):
        """`nodes`: node rank -> (host, the ranks it runs)."""
        self.timeout_s = timeout_s
        self.watch = StallWatch(timeout_s)
        self.quiet = QuietWatch(timeout_s)
        self.nodes = nodes
        self.node_of = {rank: node_rank for node_rank, (_host, ranks) in nodes.items() for rank in ranks}
        self.reported: StuckRank | QuietJob | None = None
        self.stacks: dict[int, RankStack] = {}   # rank -> its stack, as the agents answer
        self.answered: set[int] = set()          # node ranks whose stacks came
        self.verdict: HangVerdict | None = None
        self._lines: dict[int, int] = {}         # node rank -> lines its ranks printed so far
        self._asked_at = 0.0
        self._rounds = 0
        self._next_check = 0.0

    def report(self, node_rank: int, readings: list, now: float, lines: int | None = None) -> None:
        """One agent's progress message: [[rank, events, step], ...] and its ranks' output lines so far;
        readings for another node's ranks are dropped."""
        node_of, observe = self.node_of, self.watch.observe
        moved = False
        for rank, events, step in readings:
            if node_of.get(rank) == node_rank:
                moved = observe(rank, int(events), int(step), now) or moved
        if isinstance(lines, int) and lines != self._lines.get(node_rank, 0):
            self._lines[node_rank] = lines
            moved = True
        if moved:
            self.quiet.saw(now)

    def check(self, now: float) -> StuckRank | QuietJob | None:
        """The stuck rank, or the quiet job, the first time one is found (None before, and after: one a try)."""
        if self.reported is not None or now < self._next_check:
            return None
        self._next_check = now + CHECK_SECONDS
        behind = self.watch.behind(now)
        if not behind:
            if self.quiet.quiet(now):
                self._rounds += 1
                self.reported = QuietJob(self.quiet.quiet_for(now), self._rounds)
                self._asked_at = now
            return self.reported
        stall = behind[0]
        node_rank = self.node_of[stall.rank]
        host, ranks = self.nodes[node_rank]
        late = {other.rank for other in behind}
        whole_node = len(ranks) > 1 and set(ranks) <= late
        self.reported = StuckRank(stall, node_rank, host, whole_node,
                                  describe_stall(stall, host, self.timeout_s, whole_node))
        return self.reported

    def add_stacks(self, node_rank: int, records: list, round_number=None) -> None:
        """One agent's answer: its running ranks' stacks (a record that is not one, or not its rank, or an
        answer to another round than the one asked now, is dropped)."""
        if not isinstance(self.reported, QuietJob) or round_number != self.reported.round:
            return
        self.answered.add(node_rank)
        for record in records if isinstance(records, list) else ():
            stack = stack_from_json(record)
            if stack is not None and self.node_of.get(stack.rank) == node_rank:
                self.stacks[stack.rank] = stack

    def judge_hang(self, now: float, live_nodes: set[int]) -> HangVerdict | None:
        """Once every live node answered (or STACKS_WAIT_SECONDS passed): the verdict, once. A rank whose
        stack still moved (its dumps over a second differ) shows the job is busy, not hung: no verdict,
        and the quiet clock starts again."""
        if not isinstance(self.reported, QuietJob) or self.verdict is not None:
            return None
        if not live_nodes <= self.answered and now - self._asked_at < STACKS_WAIT_SECONDS:
            return None
        if any(stack.moved for stack in self.stacks.values()):   # busy, not hung: watch again from now
            self.reported, self.stacks, self.answered = None, {}, set()
            self.quiet.saw(now)
            return None
        stacks = dict(self.stacks)
        for node_rank in live_nodes - self.answered:
            for rank in self.nodes[node_rank][1]:
                stacks[rank] = RankStack(rank, (), f"its node's agent did not answer in {STACKS_WAIT_SECONDS:g} s")
        hosts = {rank: self.nodes[self.node_of[rank]][0] for rank in stacks}
        diagnosis = diagnose(stacks, hosts, self.reported.quiet_s, self.timeout_s)
        stops: dict[int, tuple[int, ...]] = {}
        for rank in diagnosis.stop:
            stops[self.node_of[rank]] = stops.get(self.node_of[rank], ()) + (rank,)
        self.verdict = HangVerdict(diagnosis, self.reported.quiet_s, stops)
        return self.verdict

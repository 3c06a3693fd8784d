"""The restart loop: run a try, and after a failure start the job again, up to --max_restarts.

Every try is a whole job (every rank everywhere stopped first, as without restarts). A lost node
is dropped when --min_nodes allows it and the job is re-planned on the survivors; a failure that
repeats at once the same way (same rank, code and last line, both tries short) stops the retries.
At a restart (with --min_nodes) a node that cannot take part (its agent cannot start, its preflight
fails) is dropped as well, and that costs no restart: the restart it was part of never began.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, replace
from typing import Callable

from launcher import console
from launcher.control.outcome import NodeTrouble, Outcome
from launcher.errors import EXIT_SIGINT, UsageError
from launcher.planning.plan import JobPlan
from launcher.planning.restart_plan import RestartPolicy, with_restart_count

QUICK_FAILURE_S = 60.0   # a try that failed sooner than this "failed at once"
PAUSE_S = 1.0            # between a try's teardown and the next try's start


@dataclass(frozen=True)
class Try:
    """A finished try: how it ended and how long it ran."""

    outcome: Outcome
    seconds: float


def repeats_at_once(previous: Try | None, last: Try) -> bool:
    """True when `last` failed the same way as `previous`, and both failed at once."""
    if previous is None or last.outcome.signature() is None:
        return False
    quick = previous.seconds < QUICK_FAILURE_S and last.seconds < QUICK_FAILURE_S
    return quick and previous.outcome.signature() == last.outcome.signature()


def next_plan(policy: RestartPolicy, plan: JobPlan, outcome: Outcome,
              replan: Callable[[JobPlan, set[int]], JobPlan]) -> tuple[JobPlan | None, str]:
    """The plan of the next try (None: do not restart) and what the console says happens next.

    `replan(plan, dropped)` plans the survivors, spares in the dropped nodes' places while any are left."""
    dropped = set(outcome.lost) | {t.node_rank for t in outcome.unreachable}
    if not dropped:
        return plan, f"restarting on {len(plan.nodes)} node(s), world size {plan.world_size}"
    if not policy.drops_nodes:
        return None, "not restarting: a node was lost and --min_nodes was not given"
    try:
        following = replan(plan, dropped)
    except UsageError:   # nothing left to plan on: no survivor and no spare
        return None, "not restarting: no node is left (nor a standby host)"
    spares = [n.host for n in following.nodes if n.host not in {m.host for m in plan.nodes}]
    if policy.min_nodes is None and len(following.nodes) < len(plan.nodes):
        return None, "not restarting: a node was lost, no standby host is left and --min_nodes was not given"
    if policy.min_nodes is not None and len(following.nodes) < policy.min_nodes:
        return None, (f"not restarting: {len(following.nodes)} node(s) left, "
                      f"fewer than --min_nodes {policy.min_nodes}")
    where = (f"on {len(following.nodes)} node(s) with standby {', '.join(spares)}" if spares
             else f"on the {len(following.nodes)} remaining node(s)")
    return following, f"restarting {where}, world size {following.world_size}, master {following.master_addr}"


def run_with_restarts(plan: JobPlan, policy: RestartPolicy, run_try: Callable[[JobPlan, bool], Outcome],
                      replan: Callable[[JobPlan, set[int]], JobPlan], pause_s: float = PAUSE_S) -> int:
    """Run tries until one succeeds, is interrupted, or no restart is left; its exit code.

    `run_try(plan, drop_unusable)`: with drop_unusable (restarts after the first try, with --min_nodes
    or --standby_hosts) a try whose nodes cannot all take part returns their `unreachable` instead of failing."""
    stop = _StopFlag()
    previous: Try | None = None
    restarts = 0
    gone: list[tuple[NodeTrouble, int]] = []   # every node dropped so far, with the try it went in
    try:
        while True:
            began = time.monotonic()
            outcome = run_try(with_restart_count(plan, restarts), restarts > 0 and policy.drops_nodes)
            last = Try(outcome, time.monotonic() - began)
            gone += [(trouble, restarts) for trouble in outcome.lost_nodes()]
            gone += [(replace(t, reason=f"unreachable, {t.reason}"), restarts) for t in outcome.unreachable]
            if outcome.ok or outcome.interrupted or stop.name or policy.max_restarts == 0:
                return _finish(outcome, restarts, policy, stop.name, gone)
            if outcome.unreachable:   # this restart never began: drop those nodes, it costs no restart
                following, what_next = next_plan(policy, plan, outcome, replan)
                console.say(f"{outcome.cause()}; {what_next}" + (" (no restart used)" if following else ""))
                if following is None:
                    return _finish(outcome, restarts, policy, None, gone)
                plan = following
                continue
            if restarts >= policy.max_restarts:
                console.say(f"{outcome.cause()}; no restart left")
                return _finish(outcome, restarts, policy, None, gone)
            if repeats_at_once(previous, last):
                console.say(f"{outcome.cause()} again, the same way within {QUICK_FAILURE_S:.0f} s of the start; "
                            f"not restarting (fix the cause, then launch again)")
                return _finish(outcome, restarts, policy, None, gone)
            following, what_next = next_plan(policy, plan, outcome, replan)
            if following is None:
                console.say(f"{outcome.cause()}; {what_next}")
                return _finish(outcome, restarts, policy, None, gone)
            restarts += 1
            console.say(f"restart {restarts}/{policy.max_restarts}: {outcome.cause()}; {what_next}")
            plan, previous = following, last
            time.sleep(pause_s)
            if stop.name:
                return _finish(Outcome(EXIT_SIGINT, interrupted=stop.name), restarts, policy, stop.name, gone)
    finally:
        stop.restore()


def summary(restarts: int, max_restarts: int, gone: list[tuple[NodeTrouble, int]]) -> str:
    """The last line: restarts used, and every node dropped on the way (why, in which try)."""
    text = f"{restarts} of {max_restarts} restart(s) used"
    if gone:
        text += "; node(s) lost: " + ", ".join(f"{t.host} ({t.reason}, try {n})" for t, n in gone)
    return text


def _finish(outcome: Outcome, restarts: int, policy: RestartPolicy, stopped: str | None,
            gone: list[tuple[NodeTrouble, int]] = ()) -> int:
    if policy.max_restarts:
        console.say(summary(restarts, policy.max_restarts, list(gone)))
    if stopped and not outcome.interrupted:
        console.say(f"stopped by {stopped} between tries; nothing is running")
        return EXIT_SIGINT if stopped == "SIGINT" else 128 + signal.SIGTERM
    return outcome.exit_code


class _StopFlag:
    """SIGINT/SIGTERM between tries (each try installs its own handlers while it runs)."""

    def __init__(self):
        self.name: str | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, _frame) -> None:
        self.name = self.name or signal.Signals(signum).name

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

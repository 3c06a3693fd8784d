"""dslaunch's side of a multi-node job: start agents, hand out the plan, supervise.

The runner only has to start one agent per node; everything after that (output,
fail-fast, heartbeats, teardown) goes through the control channel and is the same
for ssh, pdsh, mpirun and srun.
"""
from __future__ import annotations

import queue
import re
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from launcher import console
from launcher.control.check import preflight_failed
from launcher.control import unusable
from launcher.control.inbox import Inbox
from launcher.control.outcome import NodesUnusable, Outcome
from launcher.control.stalls import JobStalls, QuietJob, StuckRank
from launcher.control.startup import StartupWatch
from launcher.control.streams import OutputRelay
from launcher.errors import EXIT_NODE_LOST, EXIT_SIGINT, LaunchError
from launcher.handshake import Credentials
from launcher.node.netinfo import local_address_toward
from launcher.node.process import RankExit, stop_processes
from launcher.planning.plan import JobPlan, with_master_port
from launcher.planning.render import node_to_json
from launcher.wire import ControlEndpoint, HEARTBEAT_SECONDS

STARTUP_TIMEOUT = 60.0   # no new agent connected for this long: the startup failed
STOP_TIMEOUT = 10.0


@dataclass
class Started:
    """A runner process (ssh per node, or one pdsh/mpirun/srun for all) and its output."""

    label: str
    popen: subprocess.Popen
    node_ranks: tuple[int, ...]
    tail: deque = field(default_factory=lambda: deque(maxlen=20))
    muted: bool = False   # the job is over: its teardown noise (pdsh's "ssh exited") stays in the tail


class Controller:
    def __init__(self, plan: JobPlan, grace: float = 3.0, delivery: str = "ticket", drop_unusable: bool = False):
        """`delivery`: how the runner hands agents their key (its SECRET_DELIVERY, launcher/handshake.py).
        `drop_unusable` (a restart that may shrink): nodes whose agent cannot start or whose preflight
        fails raise NodesUnusable (the restart loop drops them) instead of ending the job."""
        self.plan = plan
        self.drop_unusable = drop_unusable
        self.grace = grace
        self.credentials = Credentials(delivery)
        self._admit_lock = threading.Lock()
        self.expected_sources = _node_addresses(plan)
        self.channels: dict = {}           # node rank -> its agent's inbox.Connection
        self.last_heard: dict[int, float] = {}
        self.done: set[int] = set()
        self.exits: list[RankExit] = []   # every rank's exit, to say when all failed alike
        self.stopping = False              # a stop went out: later exits are stopped ranks, not failures
        self.failing: RankExit | None = None  # an agent's word of a failed rank; its exit (its lines) follows
        self.hellos: dict[int, dict] = {}  # node rank -> its agent's hostname and pid
        self.lost: list[int] = []  # node ranks gone silent, whose agent died, or that never confirmed the stop
        self.lost_reasons: dict[int, str] = {}
        self.reported: set[int] = set()     # nodes whose agent said "done" (an EOF without it: the agent died)
        self.plans_sent = False
        self.died: list[int] = []           # agents that died, not yet acted on
        self.outcome: Outcome | None = None  # how this try ended (for control/restarts.py)
        self.stalls = JobStalls(plan.stall_timeout, {n.node_rank: (n.host, tuple(r.rank for r in n.ranks))
                                                     for n in plan.nodes}) if plan.stall_timeout else None
        remote = next((n for n in plan.nodes if not n.is_local), plan.nodes[0])
        toward = plan.master_addr if not remote.is_local else "127.0.0.1"
        address = local_address_toward(toward)
        # only the interface toward the nodes listens (every interface when that one is unknown)
        family = socket.AF_INET6 if address and ":" in address else socket.AF_INET
        self.listener = socket.create_server((address or "0.0.0.0", 0), family=family, backlog=len(plan.nodes) + 8)
        self.endpoint = ControlEndpoint(address or socket.gethostname(), self.listener.getsockname()[1],
                                        self.credentials.ticket)
        self.relay = OutputRelay(plan.output)
        # one selector loop owns every agent socket (control/inbox.py); its queues are our events
        self.inbox = Inbox(self.listener, self._admit, console.say)
        self.events: queue.Queue = self.inbox.events

    def _admit(self, hello, nonce: str, source: tuple) -> str | None:
        """Why a new connection's hello is refused (the inbox logs it and closes), or None."""
        with self._admit_lock:
            return self.credentials.check(hello, nonce, source[0], self.expected_sources, len(self.plan.nodes))

    def broadcast(self, message: dict) -> None:
        for channel in self.channels.values():
            channel.send(message)

    def run(self, start: Callable[[ControlEndpoint], list[Started]]) -> int:
        """Start the agents with `start`, run the job, return dslaunch's exit code."""
        started = start(self.endpoint)
        for item in started:
            item.muted = True   # until every agent is up: a failure to start says it once, with these lines
            threading.Thread(target=_pump_runner, args=(item,), daemon=True).start()
        stop_reason = {"value": None}
        previous = _install_signals(stop_reason)
        try:
            return self._supervise(started, stop_reason)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.inbox.stop()
            self.listener.close()
            if len(self.done) == len(self.plan.nodes):
                # every agent is done: let srun/pdsh/mpirun notice and end by themselves
                # (srun cancels a finished step noisily when signalled)
                # (not a lost node's: its ssh may hang on a cut link; it is ended below)
                _wait_for_exit([s.popen for s in started if not set(s.node_ranks) <= set(self.lost)], timeout=5.0)
            stop_processes([s.popen for s in started], grace=2.0)

    def _supervise(self, started: list[Started], stop_reason: dict) -> int:
        plan, expected = self.plan, len(self.plan.nodes)
        failure: RankExit | None = None
        lost: str | None = None
        stopping_since: float | None = None
        startup = StartupWatch(STARTUP_TIMEOUT, time.monotonic())
        plans_sent = False
        next_heartbeat = 0.0
        while len(self.done) < expected:
            now = time.monotonic()
            if not plans_sent:
                startup.update(len(self.channels), now)
                early, unstarted = self._startup_problem(started, startup, now)
                if early:
                    self._startup_failed(early, unstarted)
                if len(self.channels) == expected:
                    if plan.preflight:
                        self._preflight()
                    plan = self._send_plans()
                    plans_sent = self.plans_sent = True
                    for item in started:
                        item.muted = False
            if now >= next_heartbeat:
                self.broadcast({"type": "heartbeat"})
                next_heartbeat = now + HEARTBEAT_SECONDS
            if plans_sent and stopping_since is None:
                lost = lost or self._silent_node(now) or self._dead_agent()
                if self.stalls is not None:
                    self._check_stalls(now)
            reason = stop_reason["value"] or ((failure or self.failing) and "rank failure") or (lost and "node lost")
            if reason and stopping_since is None:
                stopping_since = now
                signum = signal.SIGINT if reason == "SIGINT" else signal.SIGTERM
                self.stopping = True
                self.broadcast({"type": "stop", "reason": reason, "signal": int(signum)})
                if not plans_sent:
                    break
            if stopping_since is not None and now - stopping_since > self.grace + STOP_TIMEOUT:
                console.say("some agents did not confirm the stop in time; ending their runner processes")
                unconfirmed = [n.node_rank for n in plan.nodes if n.node_rank not in self.done | set(self.lost)]
                self.lost += unconfirmed
                self.lost_reasons.update({r: "did not confirm the stop" for r in unconfirmed})
                break
            # one turn: every waiting event (failure, exit, done) first, then a bounded batch of output
            for node_rank, message in self._take_events(wait=0.0 if self.relay.pending(self.inbox) else 0.05):
                failure = self._handle(node_rank, message, failure)
            if (failure or self.failing or stop_reason["value"]) and stopping_since is None:
                continue   # the stop goes out before any more output is printed
            self.relay.print_some(self.inbox, self.last_heard)
        self.relay.print_all(self.inbox, self.last_heard)
        for item in started:   # nothing from the runners after the summary buries it
            item.muted = True
        code = self._exit_code(failure or self.failing, lost, stop_reason["value"])
        closing = self.relay.summary(self.plan.log_dir)
        if closing:
            console.say(closing)
        return code

    def _take_events(self, wait: float) -> list[tuple[int, dict]]:
        """Every event waiting now (after up to `wait` s for the first)."""
        taken = []
        try:
            taken.append(self.events.get(timeout=wait) if wait else self.events.get_nowait())
            while len(taken) < 10_000:
                taken.append(self.events.get_nowait())
        except queue.Empty:
            pass
        return taken

    def _handle(self, node_rank: int, message: dict, failure: RankExit | None) -> RankExit | None:
        kind = message["type"]
        self.last_heard[node_rank] = time.monotonic()
        host = self.plan.nodes[node_rank].host if node_rank < len(self.plan.nodes) else "?"
        if kind == "hello":
            self.channels[node_rank] = message["channel"]
            self.hellos[node_rank] = {"hostname": message.get("hostname", host), "pid": message.get("pid")}
        elif kind == "output":   # the inbox sends output apart; this is one that came another way
            self.relay.show([message])
        elif kind == "failing":   # the agent stops its node's other ranks, then sends this rank's exit
            if failure is None and self.failing is None and not self.stopping:
                self.failing = RankExit(message["rank"], message["local_rank"], message["returncode"], (), host)
        elif kind == "exit":
            done = RankExit(message["rank"], message["local_rank"], message["returncode"],
                            tuple(message.get("tail", ())), host, stuck_pid=message.get("stuck_pid"),
                            stalled_s=message.get("stalled_s"), hung_s=message.get("hung_s"))
            self.exits.append(done)
            the_failing = self.failing is not None and done.rank == self.failing.rank
            self.relay.exited(done, self.stopping and not the_failing)
            if done.stuck_pid is not None:
                console.say(done.describe())
            if not done.ok and failure is None and (not self.stopping or the_failing):
                return done
        elif kind == "progress":   # --stall_timeout: some ranks of this node moved, or printed
            if self.stalls is not None:
                self.stalls.report(node_rank, message.get("ranks", ()), time.monotonic(), message.get("lines"))
        elif kind == "stacks":   # --stall_timeout: the job went quiet; this node's ranks' stacks
            if self.stalls is not None:
                self.stalls.add_stacks(node_rank, message.get("ranks", ()), message.get("round"))
        elif kind == "error":
            console.say(f"node {node_rank} ({host}): {message['message']}")
            self.reported.add(node_rank)   # it ends on purpose: its EOF is no death
            if failure is None:
                return RankExit(-1, -1, 1, (message["message"],), host)
        elif kind == "eof" and self.plans_sent and node_rank not in self.reported | self.done:
            self.done.add(node_rank)   # the connection closed without "done": the agent died (SIGKILL, OOM)
            self.lost.append(node_rank)
            self.lost_reasons[node_rank] = "agent died"
            self.died.append(node_rank)
        elif kind in ("done", "eof"):
            if kind == "done":
                self.relay.add_held(message.get("held", 0))
            self.done.add(node_rank)
            if kind == "done":
                self.reported.add(node_rank)
        return failure

    def _check_stalls(self, now: float) -> None:
        """A stuck rank: say so once, and have its node's agent print every rank's stack there and kill it
        (its exit, marked as stopped for being stuck, then ends or restarts the job as any failure). A
        quiet job: every agent sends its ranks' stacks; once judged, one message, and the ranks it names
        are killed by their agents (their exits, marked as hung, end or restart the job the same way)."""
        found = self.stalls.check(now)
        if isinstance(found, StuckRank):
            console.say(found.message)
            channel = self.channels.get(found.node_rank)
            if channel is not None:
                channel.send({"type": "stacks", "rank": found.stall.rank, "behind_s": found.stall.behind_s})
        elif isinstance(found, QuietJob):
            self.broadcast({"type": "dump_stacks", "round": found.round})
        verdict = self.stalls.judge_hang(now, set(self.channels) - self.done)
        if verdict is not None:
            console.say(verdict.diagnosis.message)
            for node_rank, ranks in verdict.stops.items():
                if node_rank in self.channels:
                    self.channels[node_rank].send({"type": "stop_hung", "ranks": list(ranks),
                                                   "quiet_s": verdict.quiet_s})

    def _send_plans(self) -> JobPlan:
        plan = self.plan
        if plan.master_port == 0:
            answer = self.ask([0], lambda _r: {"type": "pick_port"}, "port").get(0)
            if answer is None:
                raise LaunchError(f"{_names(plan, [0])} did not say which port is free")
            plan = self.plan = with_master_port(plan, int(answer["port"]))
        job = {"master_addr": plan.master_addr, "workdir": plan.workdir, "log_dir": plan.log_dir,
               "heartbeat_timeout": plan.heartbeat_timeout, "grace": self.grace, "bind_cores": plan.bind_cores,
               "stall_timeout": plan.stall_timeout,
               "output": plan.output}
        for node in plan.nodes:
            self.channels[node.node_rank].send({"type": "plan", "job": job, "node": node_to_json(node)})
        now = time.monotonic()
        for node in plan.nodes:
            self.last_heard[node.node_rank] = now
        return plan

    def ask(self, node_ranks, message_for: Callable[[int], dict], reply_type: str,
            timeout: float = 15.0) -> dict[int, dict]:
        """Send `message_for(rank)` to each agent; {rank: reply} for those that answered in time.

        Other messages meanwhile are handled as usual; an agent that goes away ends its wait."""
        wanted = set(node_ranks)
        for rank in wanted:
            self.channels[rank].send(message_for(rank))
        replies: dict[int, dict] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            waiting = wanted - replies.keys() - self.done
            if not waiting:
                break
            try:
                rank, message = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            if rank in wanted and message["type"] == reply_type:
                replies[rank] = message
            else:
                self._handle(rank, message, None)
        return replies

    def _preflight(self) -> None:
        """The fast checks, asked of the agents; a failure stops every agent before any rank starts."""
        from launcher.preflight.via_agents import check_via_agents, hosts_of, request_for
        report = check_via_agents(hosts_of(self.plan), request_for(self.plan), self.ask, self.hellos)
        if not report.ok:
            self.broadcast({"type": "stop", "reason": "preflight failed"})
            if self.drop_unusable:
                raise NodesUnusable(unusable.from_report(self.plan, report))
            preflight_failed(report)
        console.say(f"preflight ok: {len(report.hosts)} node(s) passed in {report.elapsed_s * 1e3:.0f} ms "
                    f"(versions, workdir, master port, rendezvous)")

    def _startup_failed(self, problem: str, node_ranks: list[int]) -> None:
        """An agent could not start: with the preflight on, ask ssh itself (paramiko) why."""
        self.broadcast({"type": "stop", "reason": "an agent could not start"})
        report = None
        if self.plan.preflight and self.plan.launcher != "slurm":
            from launcher.preflight import run_preflight
            from launcher.preflight.via_agents import hosts_of, request_for
            report = run_preflight(hosts_of(self.plan), request_for(self.plan))
            if not report.ok and not self.drop_unusable:
                preflight_failed(report)   # its table says why; the runner's lines would say it again
        if self.drop_unusable:
            raise NodesUnusable(unusable.at_startup(self.plan, node_ranks, problem, report))
        raise LaunchError(problem, hint="run 'dslaunch --check' with the same hostfile to see why")

    def _startup_problem(self, started: list[Started], startup: StartupWatch,
                         now: float) -> tuple[str | None, list[int]]:
        """What keeps the agents from starting, and on which node ranks (None: nothing yet)."""
        for item in started:
            missing = [r for r in item.node_ranks if r not in self.channels]
            failed = _hosts_pdsh_gave_up_on(item, [self.plan.nodes[r] for r in missing])
            if failed:
                time.sleep(0.2)
                tail = "\n".join(f"    {line}" for line in item.tail)
                return f"{item.label} could not start the agent on {_names(self.plan, failed)}:\n{tail}", failed
            if missing and item.popen.poll() is not None:
                time.sleep(0.2)  # let the output pump drain
                tail = "\n".join(f"    {line}" for line in item.tail) or "    (no output)"
                return (f"{item.label} exited with code {item.popen.returncode} before the agent of "
                        f"{_names(self.plan, missing)} connected:\n{tail}"), missing
        if startup.stalled(now):
            missing = [n.node_rank for n in self.plan.nodes if n.node_rank not in self.channels]
            return startup.describe(_names(self.plan, missing), len(self.plan.nodes)), missing
        return None, []

    def _silent_node(self, now: float) -> str | None:
        for node in self.plan.nodes:
            heard = max(self.last_heard.get(node.node_rank, now), self.inbox.heard.get(node.node_rank, 0.0))
            if node.node_rank not in self.done and now - heard > self.plan.heartbeat_timeout:
                self.done.add(node.node_rank)  # nothing more will come from it: do not wait for it
                self.lost.append(node.node_rank)
                self.lost_reasons[node.node_rank] = f"silent for {self.plan.heartbeat_timeout:.0f} s"
                return f"node {node.node_rank} ({node.host})"
        return None

    def _dead_agent(self) -> str | None:
        if not self.died:
            return None
        node = self.plan.nodes[self.died.pop(0)]
        return f"node {node.node_rank} ({node.host})"

    def _exit_code(self, failure: RankExit | None, lost: str | None, interrupted: str | None) -> int:
        code = self._report(failure, lost, interrupted)
        lost_ranks = tuple(dict.fromkeys(self.lost))
        self.outcome = Outcome(code, failure, lost_ranks, tuple(self.plan.nodes[r].host for r in lost_ranks),
                               interrupted, tuple(self.lost_reasons.get(r, "lost") for r in lost_ranks))
        return code

    def _report(self, failure: RankExit | None, lost: str | None, interrupted: str | None) -> int:
        if failure is not None:
            every = tuple(self.exits) if len(self.exits) == self.plan.world_size else ()
            console.say(console.failure_summary(failure, exits=every))
            return failure.exit_code if failure.rank >= 0 else 1
        if lost is not None and self.lost_reasons.get(self.lost[0]) == "agent died":
            console.say(f"{lost}: its agent died (the connection closed without an exit report); "
                        f"every other node was stopped (exit code {EXIT_NODE_LOST})")
            return EXIT_NODE_LOST
        if lost is not None:
            console.say(f"{lost} stopped answering for {self.plan.heartbeat_timeout:.0f} s "
                        f"(network cut or host down); every other node was stopped (exit code {EXIT_NODE_LOST})")
            return EXIT_NODE_LOST
        if interrupted is not None:
            console.say(f"stopped by {interrupted}; every rank on every node was stopped")
            return EXIT_SIGINT if interrupted == "SIGINT" else 128 + signal.SIGTERM
        return 0


def _node_addresses(plan: JobPlan) -> dict[int, set[str]]:
    """The addresses each node's agent may call from (a one-time ticket is only good from there)."""
    found: dict[int, set[str]] = {}
    for node in plan.nodes:
        names = {node.host} | ({"127.0.0.1", "localhost", socket.gethostname()} if node.is_local else set())
        addresses: set[str] = set()
        for name in names:
            try:
                addresses |= {info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
            except OSError:
                continue
        found[node.node_rank] = addresses
    return found


def _hosts_pdsh_gave_up_on(item: Started, nodes) -> list[int]:
    """pdsh goes on with the other hosts when one fails; its 'ssh exited' line tells us (node ranks)."""
    if not item.label.startswith("pdsh"):
        return []
    failed = []
    for node in nodes:
        pattern = re.compile(rf"(^|\s){re.escape(node.ssh_target)}: ssh exited with exit code \d+")
        if any(pattern.search(line) for line in list(item.tail)):
            failed.append(node.node_rank)
    return failed


def _wait_for_exit(popens: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for popen in popens:
        try:
            popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return


def _names(plan: JobPlan, node_ranks: list[int]) -> str:
    return ", ".join(f"node {r} ({plan.nodes[r].host})" for r in node_ranks)


def _pump_runner(item: Started) -> None:
    for stream in (item.popen.stdout,):
        if stream is None:
            continue
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            item.tail.append(line)
            if not item.muted:
                console.say(f"[{item.label}] {line}")


def _install_signals(stop_reason: dict) -> dict:
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        def handler(s, _frame):
            stop_reason["value"] = stop_reason["value"] or signal.Signals(s).name
        previous[signum] = signal.signal(signum, handler)
    return previous


def spawn_runner(label: str, argv: list[str], env: dict[str, str] | None, node_ranks: tuple[int, ...],
                 stdin_data: bytes | None = None) -> Started:
    """Start one runner process with stdout and stderr merged into one watched pipe.

    `stdin_data` (the ssh runner's node key) is written on its stdin, which is then closed."""
    try:
        popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL if stdin_data is None else subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except FileNotFoundError:
        raise LaunchError(f"'{argv[0]}' is not installed on this machine",
                          hint="install it, or choose another --launcher") from None
    if stdin_data is not None:
        try:
            popen.stdin.write(stdin_data)
            popen.stdin.close()
        except OSError:
            pass  # it died at once: its output says why, and the controller reports it
    return Started(label=label, popen=popen, node_ranks=node_ranks)

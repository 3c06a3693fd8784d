"""The per-node agent: `python -m launcher.agent --connect HOST:PORT --secret stdin --node-rank N`.

Started on every node by the runner (ssh, pdsh, mpirun, srun). It dials dslaunch,
receives its node's part of the plan, starts and supervises the ranks, streams their
output back, and stops them when told to, when a rank fails, or when dslaunch goes
silent or away (its socket closes when dslaunch dies, even by SIGKILL). Torch-free.
Its key is never on its command line (`--secret stdin` or `env:VAR`), except pdsh's
one-time `--ticket`; it answers dslaunch's challenge with an HMAC (launcher/handshake.py).
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time

from launcher.handshake import proof, read_agent_key
from launcher.node.ranks import rank_specs
from launcher.output_modes import OutputFilter
from launcher.node.supervisor import NodeHooks, NodeSettings, Supervisor
from launcher.planning.render import ranks_from_json
from launcher.wire import HEARTBEAT_SECONDS, Channel, free_port, keepalive


def resolve_node_rank(value: str, environ: dict[str, str]) -> int:
    """`3`, or `env:VAR` (mpirun, srun) naming the variable that holds it."""
    if value.startswith("env:"):
        name = value[4:]
        if name not in environ:
            raise SystemExit(f"dslaunch agent: ${name} is not set; cannot tell this node's rank")
        value = environ[name]
    if not value.isdigit():
        raise SystemExit(f"dslaunch agent: bad node rank '{value}'")
    return int(value)


def connect(address: str, timeout: float = 30.0) -> Channel:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.settimeout(None)
    keepalive(sock)
    return Channel(sock)


class Agent:
    """One node's life: hello, plan, run, report, done."""

    def __init__(self, channel: Channel, node_rank: int, key: str):
        self.channel = channel
        self.node_rank = node_rank
        self.key = key
        self.supervisor: Supervisor | None = None
        self.last_heard = time.monotonic()
        self.heartbeat_timeout = 10.0
        self.pending_stop: tuple[str, int] | None = None
        self.listener = None  # node 0's rendezvous listener while the preflight runs
        # --output: lines the console will not show are not sent, only counted (by every rank's output threads)
        self.filter = OutputFilter()

    def run(self) -> int:
        challenge = self.channel.recv()
        if not challenge or challenge.get("type") != "challenge":
            print("dslaunch agent: dslaunch did not send a challenge; is this dslaunch's port?", file=sys.stderr)
            return 1
        self.channel.send({"type": "hello", "proof": proof(self.key, str(challenge["nonce"]), self.node_rank),
                           "node_rank": self.node_rank, "hostname": socket.gethostname(), "pid": os.getpid()})
        plan = self._wait_for_plan()
        if plan is None:
            return 1
        job, node = plan["job"], plan["node"]
        self.heartbeat_timeout = float(job.get("heartbeat_timeout", 10.0))
        self.filter = OutputFilter(str(job.get("output", "all")))
        if not os.path.isdir(job["workdir"]):
            self.channel.send({"type": "error", "message": f"workdir {job['workdir']} does not exist on this node"})
            return 1
        cores = sorted(os.sched_getaffinity(0)) if job.get("bind_cores") else ()
        specs = rank_specs(ranks_from_json(node), job["master_addr"], job["workdir"], dict(os.environ),
                           remap_devices=True, cores=cores)
        hooks = NodeHooks(on_output=self._send_output, on_exit=self._send_exit, on_failure=self._send_failing,
                          on_progress=self._send_progress if job.get("stall_timeout") else None,
                          on_stacks=self._send_stacks)
        self.supervisor = Supervisor(specs, hooks, NodeSettings(log_dir=job.get("log_dir"), host=node["host"],
                                                                grace=float(job.get("grace", 3.0))))
        threading.Thread(target=self._listen, daemon=True).start()
        threading.Thread(target=self._heartbeat, daemon=True).start()
        try:
            self.supervisor.start()
        except OSError as exc:
            self.channel.send({"type": "error", "message": f"cannot start rank: {exc}"})
            self.supervisor.request_stop("spawn failed")
        if self.pending_stop:
            self.supervisor.request_stop(*self.pending_stop)
        result = self.supervisor.run()
        self.channel.send({"type": "done", "ok": result.ok, "stopped_by": result.stopped_by,
                           "held": self.filter.held})
        self.channel.close()
        return 0 if result.ok else 1

    def _wait_for_plan(self) -> dict | None:
        """Answer dslaunch until the plan comes; no heartbeat deadline runs meanwhile.

        dslaunch may gather hellos (and run the preflight) for many seconds on a big job, and
        says nothing it must while it does: the silence clock starts when the plan arrives.
        A dslaunch that dies meanwhile closes the socket (recv returns None)."""
        try:
            while True:
                message = self.channel.recv()
                self.last_heard = time.monotonic()
                if message is None:
                    return None
                if message["type"] == "pick_port":
                    self.channel.send({"type": "port", "port": free_port()})
                elif message["type"] in ("probe", "probe_end"):
                    self.channel.send(self._preflight(message))
                elif message["type"] == "plan":
                    return message
                elif message["type"] == "stop":
                    return None
        finally:
            if self.listener is not None:
                self.listener.close()

    def _preflight(self, message: dict) -> dict:
        """Answer dslaunch's pre-launch checks from where the ranks will run (see preflight.via_agents)."""
        from launcher.preflight import remote_probe
        if message["type"] == "probe_end":
            listener, self.listener = self.listener, None
            if listener is None:
                return {"type": "probe_tokens", "tokens": []}
            tokens = listener.wait_for(message.get("expect") or [], 2.0)
            listener.close()  # the port is the ranks' again
            return {"type": "probe_tokens", "tokens": tokens}
        params = message["params"]
        listening = None
        try:
            if params.get("listen"):
                self.listener, listening = remote_probe.open_listener(params)
            result = remote_probe.collect(params, self.listener, as_the_ranks_will=False)
        except Exception as exc:  # a bug in a check must be a finding, not a dead agent
            return {"type": "probe_result", "result": None, "error": f"{type(exc).__name__}: {exc}"}
        return {"type": "probe_result", "result": result, "listening": listening}

    def stop(self, reason: str, signum: int = signal.SIGTERM) -> None:
        if self.supervisor is not None:
            self.supervisor.request_stop(reason, signum)
        else:
            self.pending_stop = (reason, signum)

    def _listen(self) -> None:
        while True:
            message = self.channel.recv()
            if message is None:
                self.stop("dslaunch went away")
                return
            self.last_heard = time.monotonic()
            if message["type"] == "stop":
                self.stop(message.get("reason", "stop"), int(message.get("signal", signal.SIGTERM)))
            elif message["type"] == "stacks" and self.supervisor is not None:
                self.supervisor.request_stacks(int(message["rank"]), float(message.get("behind_s", 0.0)))
            elif message["type"] == "dump_stacks" and self.supervisor is not None:
                self.supervisor.request_dump(int(message.get("round", 0)))
            elif message["type"] == "stop_hung" and self.supervisor is not None:
                self.supervisor.request_hung_stop([int(r) for r in message.get("ranks", ())],
                                                  float(message.get("quiet_s", 0.0)))

    def _heartbeat(self) -> None:
        while not self.channel.closed:
            self.channel.send({"type": "heartbeat"})
            if time.monotonic() - self.last_heard > self.heartbeat_timeout:
                self.stop("dslaunch silent")
            time.sleep(HEARTBEAT_SECONDS)

    def _send_output(self, event) -> None:
        if not self.filter.shows(event.rank):
            return   # counted as held; the rank's log file (--log_dir) has it
        self.channel.send({"type": "output", "rank": event.rank, "stream": event.stream, "line": event.line})

    def _send_failing(self, event) -> None:
        """A rank failed: dslaunch stops the other nodes now; its "exit", with its last lines, follows
        once this node's other ranks are stopped and its output is drained."""
        self.channel.send({"type": "failing", "rank": event.rank, "local_rank": event.local_rank,
                           "returncode": event.returncode})

    def _send_progress(self, readings: list[tuple[int, int, int]], output_lines: int) -> None:
        """--stall_timeout: this node's ranks whose (events, step) changed, and how many lines its ranks
        printed so far (any rank's output is a sign of life); dslaunch judges every rank of the job."""
        self.channel.send({"type": "progress", "ranks": [list(reading) for reading in readings],
                           "lines": output_lines})

    def _send_stacks(self, stacks, round_number: int) -> None:
        """--stall_timeout: dslaunch found the job quiet and asked for every rank's stack (main thread)."""
        self.channel.send({"type": "stacks", "round": round_number, "ranks": [stack.to_json() for stack in stacks]})

    def _send_exit(self, event) -> None:
        message = {"type": "exit", "rank": event.rank, "local_rank": event.local_rank,
                   "returncode": event.returncode, "tail": list(event.tail)}
        if event.stuck_pid is not None:
            message["stuck_pid"] = event.stuck_pid
        if event.stalled_s is not None:
            message["stalled_s"] = event.stalled_s
        if event.hung_s is not None:
            message["hung_s"] = event.hung_s
        self.channel.send(message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.agent", description=__doc__.splitlines()[0])
    parser.add_argument("--connect", required=True, help="HOST:PORT of dslaunch's control channel")
    parser.add_argument("--secret", help="where the key is: 'stdin' (ssh) or 'env:VAR' (srun, mpirun)")
    parser.add_argument("--ticket", help="pdsh's one-time ticket (accepted once per node, from its address)")
    parser.add_argument("--node-rank", required=True, help="N, or env:VAR")
    args = parser.parse_args(argv)
    node_rank = resolve_node_rank(args.node_rank, dict(os.environ))
    try:
        key = read_agent_key(args.secret, args.ticket, sys.stdin, os.environ)  # ranks never inherit it
    except ValueError as exc:
        print(f"dslaunch agent on {socket.gethostname()}: {exc}", file=sys.stderr)
        return 1
    try:
        channel = connect(args.connect)
    except OSError as exc:
        print(f"dslaunch agent on {socket.gethostname()}: cannot reach dslaunch at {args.connect}: {exc}",
              file=sys.stderr)
        return 1
    agent = Agent(channel, node_rank, key)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: agent.stop(signal.Signals(s).name, signal.SIGTERM))
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())

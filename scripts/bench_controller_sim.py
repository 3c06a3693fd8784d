#!/usr/bin/env python3
"""The real controller against 1024 simulated agents (issue 15): plan hand-out, CPU, memory, stop.

The controller is dslaunch's own (`Controller(plan).run(start)`, as control/launch.py drives it),
in a process of its own; its plan has N nodes at 127.1.x.y with `--ranks` slots each and
`--no-preflight`. Instead of ssh, `start` writes the endpoint and the job's secret to a file,
and `--sims` simulator processes dial in: each agent is one TCP connection speaking the real
wire protocol (JSON lines) and handshake (the HMAC answer to the challenge, ssh's per-node key).

Each agent says hello, takes its plan, sends a heartbeat a second, `--rate` lines a second for
each of its ranks (as the agents do, only the lines that `--output` shows) and, as under
`--stall_timeout` (`--stall-timeout`, 600 s by default; 0: off, the controller ignores them), every
rank's progress once a second (the most an agent
sends), until the last agent reports its first rank's exit 1. Measured:
  plan hand-out  first hello sent -> the last agent has its plan
  cores          the controller's CPU seconds / wall seconds over `--seconds` of streaming
  RSS            the controller's resident memory while streaming (max sampled) and its peak (VmHWM)
  stop           the failure report sent -> the last agent has been told to stop
  exit           the controller's exit code (the failed rank's: 1)
  lines          rank lines the agents sent, and lines the controller printed (to a file)
`--compare REV` runs the same with the controller of git revision REV (`git archive` into a temp
dir; `--compare-tree DIR` names such a tree already unpacked), side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = 0.1
SEND_BUFFER_CAP = 1 << 20   # an agent holds at most this much unsent; more lines than that are not sent


# ---------------------------------------------------------------- the controller's process
def serve(work: str, agents: int, ranks: int, output: str, stall_timeout: float = 600.0) -> int:
    """Run the controller of whichever tree PYTHONPATH names; the endpoint goes to work/endpoint.json."""
    from launcher.control.controller import Controller
    from launcher.planning.hostfile import Host
    from launcher.planning.plan import LaunchOptions, Machine, build_plan
    hosts = [Host(f"127.1.{i // 250}.{i % 250 + 1}", ranks) for i in range(agents)]
    fields = LaunchOptions.__dataclass_fields__
    extra = {"output": output} if "output" in fields else {}
    extra.update({"stall_timeout": stall_timeout or None} if "stall_timeout" in fields else {})
    options = LaunchOptions(script="train.py", launcher="ssh", no_preflight=True, **extra)
    plan = build_plan(hosts, options, Machine(python=sys.executable, cwd=work, environ={}))
    controller = Controller(plan, delivery="stdin")

    def start(endpoint):
        path = os.path.join(work, "endpoint.json")
        with open(path + ".tmp", "w") as handle:
            json.dump({"host": endpoint.host, "port": endpoint.port,
                       "secret": controller.credentials.job_secret}, handle)
        os.rename(path + ".tmp", path)
        return []
    return controller.run(start)


# ---------------------------------------------------------------- a simulator process
class SimAgent:
    def __init__(self, node_rank: int, ranks: int, key: str):
        self.node_rank = node_rank
        self.ranks = list(range(node_rank * ranks, (node_rank + 1) * ranks))
        self.key = key
        self.sock: socket.socket | None = None
        self.inbuf = b""
        self.out = bytearray()
        self.phase = "challenge"
        self.t_hello = self.t_plan = self.t_stop = None
        self.burst = b""
        self.held = 0
        self.failed_rank: int | None = None
        self.progress = 0   # events of each of its ranks (all move together: nobody is stuck)

    def queue(self, *messages: dict) -> None:
        self.out += b"".join((json.dumps(m, separators=(",", ":")) + "\n").encode() for m in messages)

    def flush(self) -> None:
        if self.out and self.sock is not None:
            try:
                del self.out[:self.sock.send(self.out)]
            except BlockingIOError:
                pass
            except OSError:
                self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.phase = "closed"


def simulate(endpoint: dict, first: int, count: int, ranks: int, rate: float) -> None:
    from launcher.handshake import node_key, proof
    from launcher.output_modes import shows
    agents = [SimAgent(r, ranks, node_key(endpoint["secret"], r)) for r in range(first, first + count)]
    selector = selectors.DefaultSelector()
    for agent in agents:
        agent.sock = socket.create_connection((endpoint["host"], endpoint["port"]), timeout=30)
        agent.sock.setblocking(False)
        selector.register(agent.sock, selectors.EVENT_READ, agent)
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    report = lambda **event: print(json.dumps(event), flush=True)  # noqa: E731
    sent = not_sent = 0
    plans_said = stops_said = False
    t_fail = None
    next_tick = next_heartbeat = time.monotonic()
    credit = 0.0
    while any(a.phase != "closed" for a in agents):
        for key, _mask in selector.select(timeout=max(0.0, next_tick - time.monotonic())):
            if key.data == "stdin":
                line = sys.stdin.readline()
                selector.unregister(sys.stdin) if not line else None
                if line.strip() == "fail":
                    failing = agents[-1]
                    failing.failed_rank = failing.ranks[0]
                    t_fail = time.time()
                    failing.queue({"type": "exit", "rank": failing.ranks[0], "local_rank": 0, "returncode": 1,
                                   "tail": ["Traceback (most recent call last):", "RuntimeError: simulated"]})
                    failing.flush()
                    report(event="failed", at=t_fail, rank=failing.ranks[0])
                continue
            agent = key.data
            try:
                data = agent.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                selector.unregister(agent.sock)
                agent.close()
                continue
            *lines, agent.inbuf = (agent.inbuf + data).split(b"\n")
            for raw in lines:
                message = json.loads(raw)
                kind = message["type"]
                if kind == "challenge":
                    agent.t_hello = time.time()
                    agent.queue({"type": "hello", "node_rank": agent.node_rank, "hostname": "sim",
                                 "pid": os.getpid(), "proof": proof(agent.key, message["nonce"], agent.node_rank)})
                elif kind == "plan":
                    agent.t_plan = time.time()
                    agent.phase = "run"
                    mode = message["job"].get("output", "all")
                    shown = [r for r in agent.ranks if shows(mode, r)]
                    agent.held_per_tick = len(agent.ranks) - len(shown)
                    agent.burst = b"".join(
                        (json.dumps({"type": "output", "rank": r, "stream": "stdout",
                                     "line": f"step 1200 loss 2.3456 lr 3.0e-04 tokens/s 123456 rank {r}"},
                                    separators=(",", ":")) + "\n").encode() for r in shown)
                    agent.lines_per_burst = len(shown)
                elif kind == "stop" and agent.phase == "run":
                    agent.t_stop = time.time()
                    agent.phase = "stopped"
                    agent.queue(*[{"type": "exit", "rank": r, "local_rank": r - agent.ranks[0], "returncode": -15,
                                   "tail": []} for r in agent.ranks if r != agent.failed_rank],
                                {"type": "done", "ok": False, "stopped_by": None, "held": agent.held})
            agent.flush()
        now = time.monotonic()
        if now >= next_tick:
            credit += rate * TICK
            bursts, credit = int(credit), credit - int(credit)
            heartbeat = now >= next_heartbeat
            if heartbeat:
                next_heartbeat = now + 1.0
            for agent in agents:
                if agent.phase != "run":
                    continue
                if heartbeat:
                    agent.progress += 3   # a forward, a backward and a step since the last report
                    agent.queue({"type": "heartbeat"},
                                {"type": "progress", "ranks": [[r, agent.progress, agent.progress // 3]
                                                               for r in agent.ranks]})
                for _ in range(bursts):
                    agent.held += agent.held_per_tick
                    if len(agent.out) < SEND_BUFFER_CAP:
                        agent.out += agent.burst
                        sent += agent.lines_per_burst
                    else:
                        not_sent += agent.lines_per_burst
            next_tick = now + TICK
        for agent in agents:
            if agent.out:
                agent.flush()
            elif agent.phase == "stopped" and agent.sock is not None:
                agent.sock.shutdown(socket.SHUT_WR)   # all said: the controller sees the end
                agent.phase = "draining"
        if not plans_said and all(a.t_plan for a in agents):
            plans_said = True
            report(event="plans", first_hello=min(a.t_hello for a in agents), last_plan=max(a.t_plan for a in agents))
        if not stops_said and all(a.t_stop for a in agents):
            stops_said = True
            report(event="stopped", last_stop=max(a.t_stop for a in agents))
    report(event="end", sent=sent, not_sent=not_sent, stopped=sum(1 for a in agents if a.t_stop))


# ---------------------------------------------------------------- the measurement
def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int) -> dict[str, float]:
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith(("VmRSS:", "VmHWM:")):
                values[line.split(":")[0]] = int(line.split()[1]) / 1024
    return values


def read_events(popen: subprocess.Popen, into: queue.Queue, index: int) -> None:
    for line in popen.stdout:
        try:
            into.put((index, json.loads(line)))
        except json.JSONDecodeError:
            pass


def wait_for(events: queue.Queue, kind: str, count: int, timeout: float, seen: list) -> list[dict]:
    found = [e for _i, e in seen if e["event"] == kind]
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        try:
            index, event = events.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        seen.append((index, event))
        if event["event"] == kind:
            found.append(event)
    return found


def measure(label: str, tree: str, args) -> dict:
    work = tempfile.mkdtemp(prefix="dsl-sim-")
    env = {**os.environ, "PYTHONPATH": tree}
    console_out = open(os.path.join(work, "console.out"), "w")
    console_err = open(os.path.join(work, "console.err"), "w")
    controller = subprocess.Popen([sys.executable, __file__, "--serve", work, "--agents", str(args.agents),
                                   "--ranks", str(args.ranks), "--output", args.output,
                                   "--stall-timeout", str(args.stall_timeout)],
                                  env=env, stdout=console_out, stderr=console_err, cwd=work)
    result = {"controller": label, "tree": tree, "agents": args.agents, "ranks_per_agent": args.ranks,
              "lines_per_rank_per_s": args.rate, "output": args.output}
    sims: list[subprocess.Popen] = []
    try:
        path = os.path.join(work, "endpoint.json")
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline and controller.poll() is None:
            time.sleep(0.05)
        if not os.path.exists(path):
            console_err.flush()
            with open(os.path.join(work, "console.err")) as handle:
                result["error"] = "the controller did not start: " + handle.read()[-2000:]
            return result
        with open(path) as handle:
            endpoint = json.load(handle)
        sim_env = {**os.environ, "PYTHONPATH": ROOT}   # the agents' side is always this tree's handshake
        share = [args.agents // args.sims + (1 if i < args.agents % args.sims else 0) for i in range(args.sims)]
        events: queue.Queue = queue.Queue()
        first = 0
        for index, count in enumerate(share):
            sim = subprocess.Popen([sys.executable, __file__, "--simulate", json.dumps(endpoint), "--first", str(first),
                                    "--count", str(count), "--ranks", str(args.ranks), "--rate", str(args.rate)],
                                   env=sim_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            threading.Thread(target=read_events, args=(sim, events, index), daemon=True).start()
            sims.append(sim)
            first += count
        seen: list = []
        plans = wait_for(events, "plans", len(sims), 180, seen)
        if len(plans) < len(sims):
            result["error"] = f"only {len(plans)} of {len(sims)} simulators got every plan"
            return result
        result["plan_handout_s"] = round(max(p["last_plan"] for p in plans) - min(p["first_hello"] for p in plans), 3)
        time.sleep(1.0)   # streaming has settled
        rss = []
        cpu0, wall0 = cpu_seconds(controller.pid), time.monotonic()
        while time.monotonic() - wall0 < args.seconds:
            rss.append(memory_mib(controller.pid)["VmRSS"])
            time.sleep(0.25)
        cpu1, wall1 = cpu_seconds(controller.pid), time.monotonic()
        result["cores_streaming"] = round((cpu1 - cpu0) / (wall1 - wall0), 3)
        result["rss_streaming_mib"] = round(max(rss), 1)
        sims[-1].stdin.write("fail\n")
        sims[-1].stdin.flush()
        failed = wait_for(events, "failed", 1, 30, seen)
        stopped = wait_for(events, "stopped", len(sims), 60, seen)
        result["rss_peak_mib"] = round(memory_mib(controller.pid)["VmHWM"], 1) if controller.poll() is None else None
        if failed and len(stopped) == len(sims):
            result["stop_broadcast_s"] = round(max(s["last_stop"] for s in stopped) - failed[0]["at"], 3)
        else:
            result["stop_broadcast_s"] = None
            result["error"] = f"{len(stopped)} of {len(sims)} simulators saw every agent stopped"
        try:
            result["exit_code"] = controller.wait(timeout=60)
        except subprocess.TimeoutExpired:
            result["exit_code"] = None
        ends = wait_for(events, "end", len(sims), 30, seen)
        result["lines_sent"] = sum(e["sent"] for e in ends)
        result["lines_not_sent_backpressure"] = sum(e["not_sent"] for e in ends)
    finally:
        for process in [controller, *sims]:
            if process.poll() is None:
                process.kill()
                process.wait()
        console_out.close()
        console_err.close()
    with open(os.path.join(work, "console.out"), "rb") as handle:
        result["lines_printed"] = sum(1 for line in handle if line.startswith(b"[rank "))
    with open(os.path.join(work, "console.err")) as handle:
        result["controller_stderr_tail"] = handle.read().splitlines()[-3:]
    return result


def export_tree(rev: str) -> str:
    """The launcher package of revision `rev`, unpacked into a temp dir."""
    target = tempfile.mkdtemp(prefix=f"dsl-rev-{rev}-")
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "launcher"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", target], input=archive.stdout, check=True)
    return target


COLUMNS = [("plan_handout_s", "plan hand-out s"), ("cores_streaming", "cores"),
           ("rss_streaming_mib", "RSS MiB"), ("rss_peak_mib", "peak RSS MiB"),
           ("stop_broadcast_s", "stop s"), ("exit_code", "exit"), ("lines_sent", "lines sent"),
           ("lines_printed", "lines printed")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1024)
    parser.add_argument("--ranks", type=int, default=8, help="ranks per agent")
    parser.add_argument("--rate", type=float, default=10.0, help="lines per second per rank")
    parser.add_argument("--seconds", type=float, default=10.0, help="streaming time measured")
    parser.add_argument("--sims", type=int, default=4, help="simulator processes")
    parser.add_argument("--output", default="all", help="--output mode of the job (this tree only)")
    parser.add_argument("--stall-timeout", type=float, default=600.0,
                        help="the job's --stall_timeout (0: off); the agents send progress either way")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--compare", metavar="REV", help="also measure the controller of git revision REV")
    parser.add_argument("--compare-tree", metavar="DIR", help="REV's tree already unpacked (no git here)")
    parser.add_argument("--serve", metavar="WORKDIR", help=argparse.SUPPRESS)
    parser.add_argument("--simulate", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve, args.agents, args.ranks, args.output, args.stall_timeout)
    if args.simulate:
        simulate(json.loads(args.simulate), args.first, args.count, args.ranks, args.rate)
        return 0
    runs = [("this tree", ROOT)]
    if args.compare:
        runs.append((args.compare, os.path.abspath(args.compare_tree) if args.compare_tree else export_tree(args.compare)))
    results = []
    for label, tree in runs:
        results.append(measure(label, tree, args))
        if not args.json:
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    document = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
                "command": " ".join(sys.argv), "results": results}
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(" | ".join(["controller"] + [title for _key, title in COLUMNS]))
        for result in results:
            print(" | ".join([result["controller"]] + [str(result.get(key)) for key, _title in COLUMNS]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The controller's selector loop (control/inbox.py): the startup limit, a stop that never
waits behind output, and sends that never block on an agent that does not read."""
import json
import socket
import sys
import threading

import pytest

from launcher.control.controller import Controller
from launcher.control.inbox import Inbox
from launcher.control.startup import StartupWatch
from launcher.handshake import proof
from launcher.planning.hostfile import parse_hostfile
from launcher.planning.plan import LaunchOptions, Machine, build_plan

STARTUP = [  # (hellos as (time, agents connected so far), time asked, stalled)
    ([], 59.0, False),
    ([], 61.0, True),
    ([(30.0, 1), (90.0, 2)], 149.0, False),   # 149 s in all, but an agent came 59 s ago
    ([(30.0, 1), (90.0, 2)], 151.0, True),
    ([(30.0, 1), (80.0, 1)], 91.0, True),     # the same count again is no progress
]


@pytest.mark.parametrize("hellos, now, stalled", STARTUP)
def test_the_start_fails_only_after_60_s_without_a_new_agent(hellos, now, stalled):
    watch = StartupWatch(60.0, since=0.0)
    for at, connected in hellos:
        watch.update(connected, at)
    assert watch.stalled(now) is stalled


def test_the_startup_message_says_how_many_had_connected():
    watch = StartupWatch(60.0, since=0.0)
    watch.update(3, 5.0)
    assert watch.describe("node 3 (w3)", 4) == ("no agent from node 3 (w3) after 60 s in which no new agent "
                                                "connected (3 of 4 had)")


def test_a_send_to_an_agent_that_does_not_read_never_blocks():
    listener = socket.create_server(("127.0.0.1", 0))
    inbox = Inbox(listener, lambda hello, nonce, source: None, lambda text: None)
    client = socket.create_connection(listener.getsockname())
    client.sendall(b'{"type":"hello","node_rank":0}\n')
    _rank, hello = inbox.events.get(timeout=60)
    line = {"type": "heartbeat", "pad": "x" * 1000}
    sent = []
    sender = threading.Thread(target=lambda: sent.extend(hello["channel"].send(line) for _ in range(20_000)))
    sender.start()          # 20 MB: far more than the socket buffers hold, and the agent reads nothing yet
    sender.join(timeout=120)   # not a speed bound: a send that blocks never returns at all
    assert not sender.is_alive() and sent == [True] * 20_000
    reader = client.makefile("rb")     # only now does the agent read: every line is there, in order
    assert json.loads(reader.readline())["type"] == "challenge"
    assert all(json.loads(reader.readline()) == line for _ in range(20_000))
    client.close()
    inbox.stop()
    listener.close()


def test_the_inbox_loop_has_ended_when_stop_returns():
    """The controller closes its listener right after inbox.stop(): the loop must be done with it."""
    listener = socket.create_server(("127.0.0.1", 0))
    in_turn, release, order = threading.Event(), threading.Event(), []

    def admit(hello, nonce, source):   # runs on the inbox's thread, in the middle of one loop turn
        in_turn.set()
        release.wait(60)
        order.append("loop turn ended")
    inbox = Inbox(listener, admit, lambda text: None)
    client = socket.create_connection(listener.getsockname())
    client.sendall(b'{"type":"hello","node_rank":0}\n')
    assert in_turn.wait(60)
    stopper = threading.Thread(target=lambda: (inbox.stop(), order.append("stop returned")))
    stopper.start()
    stopper.join(timeout=0.5)   # a stop that does not wait for the loop returns meanwhile
    release.set()
    stopper.join(timeout=60)
    assert order == ["loop turn ended", "stop returned"]
    client.close()
    listener.close()


class Printed:
    """sys.stdout for the controller: counts rank lines."""

    def __init__(self):
        self.lines = 0

    def write(self, text):
        self.lines += text.count("\n")

    def flush(self):
        pass


def fake_agent(endpoint, key, node_rank, then):
    sock = socket.create_connection((endpoint.host, endpoint.port), timeout=30)
    reader = sock.makefile("rb")
    nonce = json.loads(reader.readline())["nonce"]
    sock.sendall((json.dumps({"type": "hello", "node_rank": node_rank, "proof": proof(key, nonce, node_rank)})
                  + "\n").encode())
    for line in reader:
        if json.loads(line)["type"] == "plan":
            break
    then(sock, reader)
    sock.close()


def two_node_controller(**options):
    """A controller for one rank on each of two nodes over ssh (the agents are fake_agent threads)."""
    hosts = parse_hostfile("localhost slots=1\n127.0.0.1 slots=1\n", "h")
    plan = build_plan(hosts, LaunchOptions(script="t.py", launcher="ssh", no_preflight=True, **options),
                      Machine(python="/py", cwd="/", environ={}))
    return Controller(plan, grace=0.1, delivery="stdin")


def agents_start(controller, *nodes):
    """The controller's start function: one fake agent per node, node k playing ``nodes[k]``."""
    def start(endpoint):
        for rank, then in enumerate(nodes):
            key = controller.credentials.key_for(rank)
            threading.Thread(target=fake_agent, args=(endpoint, key, rank, then), daemon=True).start()
        return []
    return start


def wait_for_stop(reader):
    for line in reader:
        if json.loads(line)["type"] == "stop":
            return


def send(sock, *messages):
    sock.sendall(b"".join((json.dumps(m, separators=(",", ":")) + "\n").encode() for m in messages))


def test_a_failure_is_handled_before_the_output_that_came_ahead_of_it(monkeypatch):
    """Node 1 sends 100k lines, then its rank's exit 1; node 0 is told to stop before they are printed."""
    hosts = parse_hostfile("localhost slots=1\n127.0.0.1 slots=1\n", "h")
    plan = build_plan(hosts, LaunchOptions(script="t.py", launcher="ssh", no_preflight=True),
                      Machine(python="/py", cwd="/", environ={}))
    controller = Controller(plan, grace=0.1, delivery="stdin")
    printed = Printed()
    monkeypatch.setattr(sys, "stdout", printed)
    flood = 100_000
    seen = {}

    def node0(sock, reader):
        wait_for_stop(reader)
        seen["printed at stop"] = printed.lines
        send(sock, {"type": "exit", "rank": 0, "local_rank": 0, "returncode": -15}, {"type": "done", "ok": False})

    def node1(sock, reader):
        line = b'{"type":"output","rank":1,"stream":"stdout","line":"loss 2.3 step 100 of a long run"}\n'
        sock.sendall(line * flood)
        send(sock, {"type": "exit", "rank": 1, "local_rank": 0, "returncode": 1})
        wait_for_stop(reader)
        send(sock, {"type": "done", "ok": False})

    code = controller.run(agents_start(controller, node0, node1))
    assert code == 1
    assert printed.lines >= flood                 # every line is printed in the end
    assert seen["printed at stop"] < flood        # but the stop did not wait for them


def test_an_agents_word_of_a_failed_rank_stops_the_other_nodes_before_its_exit_comes(capsys):
    """Node 1's agent says "failing" the moment its rank fails; it sends the rank's exit (with its
    last lines) only after stopping its other ranks and draining the failed one's output. Node 0
    is stopped on the word alone, and the job still ends with one message naming rank 1."""
    controller = two_node_controller()
    stops = {}

    def stop_reason(reader):
        for line in reader:
            message = json.loads(line)
            if message["type"] == "stop":
                return message["reason"]

    def node0(sock, reader):
        stops[0] = stop_reason(reader)
        send(sock, {"type": "exit", "rank": 0, "local_rank": 0, "returncode": -15}, {"type": "done", "ok": False})

    def node1(sock, reader):
        send(sock, {"type": "failing", "rank": 1, "local_rank": 0, "returncode": 3})
        stops[1] = stop_reason(reader)       # the exit is not sent before the stop came
        send(sock, {"type": "exit", "rank": 1, "local_rank": 0, "returncode": 3, "tail": ["config error: boom"]},
             {"type": "done", "ok": False})

    code = controller.run(agents_start(controller, node0, node1))
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dslaunch: ")]
    assert stops == {0: "rank failure", 1: "rank failure"}
    assert code == 3
    assert [line for line in said if "exited with code" in line] == \
        ["dslaunch: rank 1 on 127.0.0.1 exited with code 3 (the first failure; every other rank was stopped)"]
    assert controller.outcome.failure.tail == ("config error: boom",)


def test_a_rank_stuck_on_a_node_of_its_own_is_named_once_and_its_node_asked_for_the_stacks(capsys):
    """--stall_timeout judged by dslaunch: one rank per node, node 1's rank stops moving while node 0's
    goes on; dslaunch names it, asks node 1's agent (only) for its stacks, and ends with its exit."""
    controller = two_node_controller(stall_timeout=1.0)
    asked = {}

    def told(reader):
        for line in reader:
            message = json.loads(line)
            if message["type"] in ("stop", "stacks"):
                return message

    def node0(sock, reader):
        send(sock, {"type": "progress", "ranks": [[0, 5, 2]]}, {"type": "progress", "ranks": [[0, 6, 2]]})
        asked[0] = told(reader)
        send(sock, {"type": "exit", "rank": 0, "local_rank": 0, "returncode": -15}, {"type": "done", "ok": False})

    def node1(sock, reader):
        send(sock, {"type": "progress", "ranks": [[1, 5, 2]]})
        asked[1] = told(reader)   # the agent dumps its ranks' stacks and kills the stuck one
        send(sock, {"type": "failing", "rank": 1, "local_rank": 0, "returncode": -9},
             {"type": "exit", "rank": 1, "local_rank": 0, "returncode": -9, "stalled_s": 1.0})
        told(reader)
        send(sock, {"type": "done", "ok": False})

    code = controller.run(agents_start(controller, node0, node1))
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dslaunch: ")]
    assert asked[1] == {"type": "stacks", "rank": 1, "behind_s": asked[1]["behind_s"]}
    assert asked[0]["type"] == "stop"   # node 0 is only stopped, once node 1's rank failed
    stuck = [line for line in said if "is stuck" in line]
    assert len(stuck) == 1 and stuck[0].startswith("dslaunch: rank 1 on 127.0.0.1 is stuck after step 2"), said
    assert said.index(stuck[0]) < next(i for i, line in enumerate(said) if "was stopped as stuck" in line)
    assert code == 137


def test_a_quiet_job_is_diagnosed_once_from_every_nodes_stacks_and_its_cause_stopped(capsys):
    """--stall_timeout judged by dslaunch for a plain script: each node printed a line, then nothing
    moved; dslaunch asks every agent for its ranks' stacks, says one message naming rank 1 (outside any
    collective) and rank 0 waiting in all_reduce, has node 1 (only) stop its rank, and ends with 137."""
    controller = two_node_controller(stall_timeout=1.0)
    told, stop_hung = {0: [], 1: []}, {}
    c10d = "/v/torch/distributed/distributed_c10d.py"

    def until(reader, node, kinds):
        for line in reader:
            told[node].append(json.loads(line)["type"])
            if told[node][-1] in kinds:
                return json.loads(line)

    def node0(sock, reader):
        send(sock, {"type": "progress", "ranks": [], "lines": 2})
        asked = until(reader, 0, ("dump_stacks",))
        send(sock, {"type": "stacks", "round": asked["round"], "ranks": [{"rank": 0, "frames": [[c10d, 3252, "all_reduce", ""],
                                                                       ["/t.py", 17, "main", "dist.all_reduce(x)"]]}]})
        until(reader, 0, ("stop",))
        send(sock, {"type": "exit", "rank": 0, "local_rank": 0, "returncode": -15}, {"type": "done", "ok": False})

    def node1(sock, reader):
        send(sock, {"type": "progress", "ranks": [], "lines": 2})
        asked = until(reader, 1, ("dump_stacks",))
        send(sock, {"type": "stacks", "round": asked["round"], "ranks": [{"rank": 1, "frames": [["/t.py", 9, "load_batch", "time.sleep(1000)"],
                                                                       ["/t.py", 16, "main", ""]]}]})
        stop_hung.update(until(reader, 1, ("stop_hung",)))   # the agent kills its rank, marked as hung
        send(sock, {"type": "failing", "rank": 1, "local_rank": 0, "returncode": -9},
             {"type": "exit", "rank": 1, "local_rank": 0, "returncode": -9, "hung_s": 1.2})
        until(reader, 1, ("stop",))
        send(sock, {"type": "done", "ok": False})

    code = controller.run(agents_start(controller, node0, node1))
    err = capsys.readouterr().err
    assert code == 137
    assert "stop_hung" not in told[0]   # node 0's rank was only stopped, as any other after a failure
    assert stop_hung["ranks"] == [1] and stop_hung["quiet_s"] >= 1.0
    assert err.count("every rank's Python stack was taken") == 1, err   # one message for the job
    assert "likely cause: rank 1 on 127.0.0.1 is not in a collective, in load_batch" in err
    assert "      /t.py:9 in load_batch: time.sleep(1000)" in err
    assert "waiting in all_reduce: rank 0 (called at /t.py:17 in main)" in err
    assert "rank 1 on 127.0.0.1 was stopped as hung: no rank made progress for 1 s" in err

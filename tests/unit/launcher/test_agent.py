"""A node's agent against a scripted dslaunch over a real socket pair, with a real rank process.

At 64+ nodes dslaunch gathers hellos for longer than the heartbeat timeout; an agent that
counted that wait as silence stopped its ranks the moment they started.
"""
import signal
import socket
import sys
import threading
import time

import pytest

from launcher.node.agent import Agent
from launcher.wire import Channel

TIMEOUT = 1.0  # the job's heartbeat_timeout; the plan comes later than this


def plan_message(workdir, code):
    job = {"master_addr": "127.0.0.1", "workdir": str(workdir), "log_dir": None,
           "heartbeat_timeout": TIMEOUT, "grace": 1.0, "bind_cores": False}
    node = {"host": "localhost", "node_rank": 0, "slots": [0],
            "ranks": [{"rank": 0, "local_rank": 0, "argv": [sys.executable, "-c", code], "env": {}}]}
    return {"type": "plan", "job": job, "node": node}


class ScriptedDslaunch:
    """dslaunch's end of the channel: challenge, a wait, the plan, then heartbeats (or none)."""

    def __init__(self, sock, plan, wait_s, beat_before, beat_after):
        self.channel = Channel(sock)
        self.plan, self.wait_s = plan, wait_s
        self.beat_before, self.beat_after = beat_before, beat_after
        self.received = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.channel.send({"type": "challenge", "nonce": "n"})
        self.received.append(self.channel.recv())            # hello
        until = time.monotonic() + self.wait_s
        while time.monotonic() < until:
            if self.beat_before:
                self.channel.send({"type": "heartbeat"})
            time.sleep(0.2)
        self.channel.send(self.plan)
        threading.Thread(target=self._beat, daemon=True).start()
        while (message := self.channel.recv()) is not None:
            self.received.append(message)

    def _beat(self):
        time.sleep(0.3)   # dslaunch's next heartbeat comes up to HEARTBEAT_SECONDS after the plan
        while self.beat_after and not self.channel.closed:
            self.channel.send({"type": "heartbeat"})
            time.sleep(0.2)

    def of_type(self, kind):
        return [m for m in self.received if m and m["type"] == kind]


def run_agent(tmp_path, code, wait_s, beat_before=True, beat_after=True):
    ours, theirs = socket.socketpair()
    dslaunch = ScriptedDslaunch(theirs, plan_message(tmp_path, code), wait_s, beat_before, beat_after)
    code = Agent(Channel(ours), 0, "key").run()
    dslaunch.thread.join(timeout=60)
    return code, dslaunch


def done_reports(dslaunch):
    """The agent's "done" messages without the count of output lines it held back (--output)."""
    return [{k: v for k, v in m.items() if k != "held"} for m in dslaunch.of_type("done")]


@pytest.mark.parametrize("beat_before", [True, False], ids=["heartbeats-meanwhile", "silent-meanwhile"])
def test_a_plan_later_than_the_heartbeat_timeout_still_runs_the_ranks(tmp_path, beat_before):
    code, dslaunch = run_agent(tmp_path, "import time; time.sleep(0.5); print('ran', flush=True)",
                                  wait_s=TIMEOUT + 0.6, beat_before=beat_before)
    assert [m["returncode"] for m in dslaunch.of_type("exit")] == [0]
    assert [m["line"] for m in dslaunch.of_type("output")] == ["ran"]
    assert done_reports(dslaunch) == [{"type": "done", "ok": True, "stopped_by": None}] and code == 0


def test_dslaunch_silent_after_the_plan_still_stops_the_ranks(tmp_path):
    code, dslaunch = run_agent(tmp_path, "import time; time.sleep(30)", wait_s=0.2, beat_after=False)
    assert done_reports(dslaunch) == [{"type": "done", "ok": False, "stopped_by": "dslaunch silent"}]
    # the agent stopped the rank (SIGTERM): it did not sleep its 30 s out
    assert [m["returncode"] for m in dslaunch.of_type("exit")] == [-signal.SIGTERM] and code == 1

"""The pre-launch checks asked of the agents: the controller's sequence (preflight.via_agents)
against the agent's real answers (Agent._preflight), on this machine, with the wire replaced
by direct calls. The cluster tests run the same through real ssh and sockets."""
import json
import os
import socket
import subprocess
import sys

import pytest

from launcher.node.agent import Agent
from launcher.planning.hostfile import Host
from launcher.preflight import PreflightRequest
from launcher.preflight.via_agents import check_via_agents


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, master_addr="127.0.0.1"):
    return PreflightRequest(master_addr=master_addr, master_port=port, fast=True, workdir=os.getcwd())


class Nodes:
    """n agents on this machine; `tamper[rank]` edits an answer, `silent` ranks never answer."""

    def __init__(self, n, tamper=None, silent=()):
        self.agents = [Agent(None, rank, "t") for rank in range(n)]
        self.tamper = tamper or {}
        self.silent = set(silent)
        self.asked = []

    def ask(self, ranks, message_for, reply_type):
        replies = {}
        for rank in ranks:
            message = message_for(rank)
            self.asked.append((rank, message["type"]))
            if rank in self.silent:
                continue
            reply = self.agents[rank]._preflight(message)
            assert reply["type"] == reply_type
            replies[rank] = self.tamper.get(rank, lambda r: r)(reply)
        return replies

    def close(self):
        for agent in self.agents:
            if agent.listener is not None:
                agent.listener.close()


def with_torch(version):
    def edit(reply):
        reply["result"]["torch"] = {"version": version}
        return reply
    return edit


HOSTS = [Host("node1", 2), Host("node2", 2)]


def checks_of(report):
    return {(h.host, c.name): c for h in report.hosts for c in h.checks}


def run(port, master_addr="127.0.0.1", **nodes_kw):
    nodes = Nodes(len(HOSTS), **nodes_kw)
    try:
        return check_via_agents(HOSTS, request(port, master_addr), nodes.ask, {0: {"hostname": "n1", "pid": 7}}), nodes
    finally:
        nodes.close()


def has_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("master_addr", [
    "127.0.0.1",
    pytest.param("::1", marks=pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback")),
])
def test_healthy_nodes_pass_every_fast_check_in_order(master_addr):
    report, nodes = run(free_port(), master_addr)
    assert report.ok, report.format_table()
    found = checks_of(report)
    for host in ("node1", "node2"):
        for name in ("agent", "python", "torch", "dslaunch", "workdir", "rendezvous"):
            assert found[(host, name)].ok, (host, name)
    assert found[("node1", "master_port")].ok
    assert found[("node1", "agent")].detail == "running on n1 (pid 7)"
    assert f"reached {master_addr}:" in found[("node2", "rendezvous")].detail
    assert "via lo" in found[("node2", "rendezvous")].detail
    # node 0 listens first, then the others connect, then node 0 says who arrived
    assert nodes.asked == [(0, "probe"), (1, "probe"), (0, "probe_end")]


def test_the_listener_is_gone_once_the_checks_end():
    port = free_port()
    report, _ = run(port)
    assert report.ok
    with socket.socket() as s:  # the ranks can take the port
        s.bind(("", port))


IPV6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback")


@pytest.mark.parametrize("family, where", [(socket.AF_INET, ""), (socket.AF_INET, "127.0.0.1"),
                                           pytest.param(socket.AF_INET6, "::", marks=IPV6),
                                           pytest.param(socket.AF_INET6, "::1", marks=IPV6)])
def test_a_taken_port_fails_on_node_0_naming_its_owner_and_nobody_connects(family, where):
    with socket.socket(family) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((where, 0))
        holder.listen()
        port = holder.getsockname()[1]
        report, nodes = run(port)
    found = checks_of(report)
    assert not report.ok
    assert not found[("node1", "master_port")].ok
    assert f"port {port} is taken on node1" in found[("node1", "master_port")].detail
    assert str(os.getpid()) in found[("node1", "master_port")].detail
    assert ("node2", "rendezvous") not in found
    assert (0, "probe_end") not in nodes.asked


@pytest.mark.parametrize("port", [0])
def test_master_port_0_checks_that_free_ports_exist(port):
    report, _ = run(port)
    assert report.ok
    assert "free ports exist on node1" in checks_of(report)[("node1", "master_port")].detail


@pytest.mark.parametrize("tamper, host, check, words", [
    ({1: with_torch("2.4.0")}, "node2", "torch", "2.4.0"),
    ({1: with_torch(None)}, "node2", "torch", "not importable"),
])
def test_a_node_that_differs_fails_its_own_check(tamper, host, check, words):
    report, _ = run(free_port(), tamper=tamper)
    found = checks_of(report)
    assert not report.ok
    assert not found[(host, check)].ok and words in found[(host, check)].detail
    assert found[("node1", "dslaunch")].ok


def test_an_agent_that_never_answers_is_named_with_a_hint():
    report, _ = run(free_port(), silent={1})
    found = checks_of(report)
    assert [h.host for h in report.failed_hosts] == ["node2"]
    assert "no answer from the agent" in found[("node2", "probe")].detail
    assert "dslaunch --check" in found[("node2", "probe")].hint


def test_the_agent_reports_what_the_ranks_will_import(tmp_path):
    """torch as found through the ranks' PYTHONPATH (a fresh process: here torch is imported already)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "torch" / "version.py").write_text("__version__ = '9.9.9'\ncuda = None\n")
    code = ("import json; from launcher.node.agent import Agent; "
            "print(json.dumps(Agent(None, 0, 't')._preflight({'type': 'probe', 'params': "
            f"{{'workdir': '/', 'pythonpath': {str(tmp_path)!r}}}}})['result']['torch']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert json.loads(out.stdout) == {"version": "9.9.9", "cuda_build": None}


def test_the_agent_looks_without_moving(tmp_path):
    before = (os.getcwd(), list(sys.path), os.environ.get("PATH"))
    agent = Agent(None, 0, "t")
    reply = agent._preflight({"type": "probe", "params": {"workdir": str(tmp_path), "pythonpath": "/x/y",
                                                          "path": "/only/this"}})
    assert reply["result"]["workdir"] == {"path": str(tmp_path), "exists": True}
    assert (os.getcwd(), sys.path, os.environ.get("PATH")) == before
    missing = agent._preflight({"type": "probe", "params": {"workdir": "/nonexistent-dir"}})
    assert missing["result"]["workdir"] == {"path": "/nonexistent-dir", "exists": False}

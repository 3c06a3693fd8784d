"""The pre-launch preflight, asked of the agents over their control channels.

Each agent already runs where its ranks will run (their interpreter, their working
directory), so a second ssh connection per host would only repeat what starting the
agent proved. dslaunch asks instead: node 0 opens the rendezvous listener on
MASTER_PORT and reports its facts, every other node reports its facts and connects to
that listener, node 0 says which connections arrived. The findings go through the same
checks, hints and table as `dslaunch --check`. No rank starts before this passes.

`ask(node_ranks, message_for, reply_type)` is the controller's side of the channel: it
sends `message_for(rank)` to each rank and returns {rank: reply} for those that answered.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

from launcher.preflight.report import Check, PreflightReport
from launcher.preflight.request import PreflightRequest
from launcher.preflight.run import HostState, Listening, host_report, probe_params, version_problems

Ask = Callable[[Iterable[int], Callable[[int], dict], str], dict]

NO_ANSWER_HINT = "the agent started but did not answer; run 'dslaunch --check' with the same hostfile"


def hosts_of(plan) -> list:
    """The plan's nodes as the preflight's hosts (name, slots, ssh user and port)."""
    from launcher.planning.hostfile import Host
    return [Host(n.host, len(n.slots), user=n.ssh_target.rpartition("@")[0] or None, port=n.ssh_port)
            for n in plan.nodes]


def request_for(plan) -> PreflightRequest:
    """The fast checks for a plan: versions, workdir, master port and rendezvous."""
    return PreflightRequest(remote_python=plan.python, workdir=plan.workdir, master_addr=plan.master_addr,
                            master_port=plan.master_port, launcher=plan.launcher, fast=True,
                            env=dict(plan.nodes[0].ranks[0].env))


def check_via_agents(hosts: Sequence, request: PreflightRequest, ask: Ask,
                     hellos: dict[int, dict] | None = None) -> PreflightReport:
    """Every host's fast checks, from the facts its agent reports. Never raises for a finding."""
    from launcher import __version__

    started = time.monotonic()
    hellos = hellos or {}
    states = [HostState(h, i) for i, h in enumerate(hosts)]
    for s in states:
        hello = hellos.get(s.index, {})
        s.checks.append(Check("agent", True, f"running on {hello.get('hostname', s.host.name)}"
                              f" (pid {hello.get('pid', '?')})"))
    listening = Listening()
    master_addr = request.master_addr

    def probe(s: HostState) -> dict:
        return {"type": "probe", "params": probe_params(s, request, master_addr, True, listening)}

    first = states[0]
    _take(first, ask([0], lambda _i: probe(first), "probe_result").get(0))
    if first.listening is not None:
        listening.report(bool(first.listening.get("ok")), int(first.listening.get("port") or 0))
    rest = states[1:]
    replies = ask([s.index for s in rest], lambda i: probe(states[i]), "probe_result") if rest else {}
    for s in rest:
        _take(s, replies.get(s.index))
    tokens = None
    if listening.ok:
        expected = [str(s.index) for s in states if ((s.result or {}).get("connect") or {}).get("ok")]
        answer = ask([0], lambda _i: {"type": "probe_end", "expect": expected}, "probe_tokens").get(0)
        tokens = set(answer.get("tokens") or []) if answer else None
    problems = version_problems(states, __version__)
    reports = tuple(host_report(s, request, None, problems, master_addr, True, tokens) for s in states)
    return PreflightReport(reports, time.monotonic() - started)


def _take(s: HostState, reply: dict | None) -> None:
    if reply is None or reply.get("result") is None:
        detail = "no answer from the agent" if reply is None else f"the agent's probe failed: {reply.get('error')}"
        s.checks.append(Check("probe", False, detail, NO_ANSWER_HINT))
        return
    s.result = reply.get("result")
    s.listening = reply.get("listening")

"""run_preflight: every host at once, one ssh connection and one probe round trip each.

Order of events: all hosts connect in parallel; the first node starts its probe with a
rendezvous listener on MASTER_PORT; once it listens (or failed to bind), the other
probes run in parallel and each opens a TCP connection to MASTER_ADDR:port carrying
its token; then the first node's stdin is closed and it reports the tokens it saw.
Nothing here raises for a host's problem: every finding becomes a Check.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

from launcher.preflight import checks as C
from launcher.preflight.classify import classify
from launcher.preflight.local import client_check, launcher_tool_check
from launcher.preflight.report import Check, HostReport, PreflightReport
from launcher.preflight.request import PreflightRequest
from launcher.preflight.target import SshTarget, resolve_target

PROBE_SOURCE_PATH = os.path.join(os.path.dirname(__file__), "remote_probe.py")
# reads one line of params, then exactly N bytes of source, from stdin; the rest of
# stdin stays open (the first node's listener runs until it closes)
BOOTSTRAP = ("import sys,json;b=sys.stdin.buffer;p=json.loads(b.readline());n=int(b.readline());"
             "exec(compile(b.read(n),'<dslaunch-probe>','exec'),"
             "{'__name__':'__main__','PARAMS':p})")


class Listening:
    """The first node's listener state, shared with the other hosts' workers."""

    def __init__(self):
        self.event = threading.Event()
        self.ok = False
        self.port = 0

    def report(self, ok: bool, port: int) -> None:
        self.ok, self.port = ok, port
        self.event.set()


@dataclass
class HostState:
    host: object
    index: int
    target: SshTarget | None = None
    checks: list = field(default_factory=list)
    result: dict | None = None
    listening: dict | None = None
    process: object = None
    session: object = None
    client: Check | None = None  # the runner's own ssh/pdsh reaching this host (full check)


def run_preflight(hosts: Sequence, request: PreflightRequest, *, connector=None,
                  resolve: Callable = resolve_target, which: Callable | None = None,
                  run: Callable | None = None) -> PreflightReport:
    """Check every host; never raises for what it finds. Hosts need .name .slots .user .port."""
    import subprocess

    from launcher import __version__

    if connector is None:
        from launcher.preflight.sshclient import ParamikoConnector

        connector = ParamikoConnector()
    started = time.monotonic()
    run = run or subprocess.run
    tool = launcher_tool_check(request.launcher, which=which, run=run)
    states = [HostState(h, i) for i, h in enumerate(hosts)]
    if not states:
        return PreflightReport((), time.monotonic() - started)
    first = states[0]
    first.target = _resolve(resolve, first.host, request)
    master_addr = request.master_addr or first.target.hostname
    rendezvous = request.rendezvous
    listening = Listening()
    clients = {}
    with ThreadPoolExecutor(max_workers=min(128, 2 * len(states))) as pool:
        if not request.fast and tool is not None and tool.ok:
            clients = {s.index: pool.submit(client_check, request.launcher, s.host,
                                            getattr(s.host, "port", None) or request.ssh_port,
                                            request.timeout, run) for s in states}
        futures = [pool.submit(_check_host, s, request, connector, resolve, master_addr,
                               rendezvous, listening) for s in states]
        for future in futures[1:]:
            future.result()
        futures[0].result()
        for s in states:  # the runner's own client matters only where ssh itself works
            if s.index in clients and s.checks and s.checks[0].name == "ssh" and s.checks[0].ok:
                s.client = clients[s.index].result()
    tokens = _close_listener(first, request) if rendezvous else None
    problems = version_problems(states, __version__)
    reports = tuple(host_report(s, request, tool, problems, master_addr, rendezvous, tokens)
                    for s in states)
    return PreflightReport(reports, time.monotonic() - started)


def host_report(s, request, tool, problems, master_addr, rendezvous, tokens) -> HostReport:
    """One host's checks in reading order: launcher tool, ssh, probe findings, rendezvous."""
    found = list(s.checks)
    if tool is not None:
        found.insert(0, s.client or tool)
    if s.result is not None:
        found += C.host_checks(s.host.name, s.host.slots, s.result, request,
                               {k: problems[k][s.index] for k in problems})
        if s.index == 0 and rendezvous:
            found.append(C.master_port_check(s.listening, s.host.name, request.master_port))
        if rendezvous and "connect" in s.result:
            seen = None if tokens is None else str(s.index) in tokens
            port = s.result["connect"].get("port", request.master_port)
            found.append(C.rendezvous_check(s.result, master_addr, port, seen))
    return HostReport(s.host.name, tuple(found))


def _resolve(resolve, host, request) -> SshTarget:
    port = getattr(host, "port", None) or request.ssh_port
    try:
        return resolve(host.name, getattr(host, "user", None), port, request.timeout)
    except Exception:  # a broken ssh config still gets a plain target
        return SshTarget(alias=host.name, hostname=host.name, port=port or 22,
                         user=getattr(host, "user", None))


def probe_params(s: HostState, request, master_addr, rendezvous, listening) -> dict:
    env = request.env or {}
    listen = rendezvous and s.index == 0
    return {"full": not request.fast, "workdir": request.workdir, "script": request.script,
            "master_addr": master_addr,
            "master_port": request.master_port if listen else listening.port,
            "listen": listen, "connect": rendezvous and (listen or listening.ok),
            "token": str(s.index), "connect_timeout": min(3.0, request.timeout),
            "listen_deadline": request.probe_timeout + request.timeout * 2,
            "pythonpath": env.get("PYTHONPATH", ""), "path": env.get("PATH", "")}


def _check_host(s, request, connector, resolve, master_addr, rendezvous, listening):
    """One host's ssh connection and probe; the first host also signals `listening`."""
    try:
        if s.target is None:
            s.target = _resolve(resolve, s.host, request)
        try:
            s.session = connector.connect(s.target, request.timeout)
        except Exception as e:  # every connect failure is a finding
            s.checks.append(classify(e, s.target, request.timeout))
            return
        s.checks.append(Check("ssh", True, f"{s.target.destination} ({s.session.auth})"))
        if s.index != 0 and rendezvous:
            listening.event.wait(request.timeout + request.probe_timeout)
        _probe(s, request, master_addr, rendezvous, listening)
    except Exception as e:  # a bug or an odd server must not hide the other hosts
        s.checks.append(Check("probe", False, f"preflight error: {type(e).__name__}: {e}", None))
    finally:
        if s.index == 0:
            listening.event.set()  # unblock the others even when the first node failed
        if s.session is not None and s.process is None:
            s.session.close()


def _probe(s, request, master_addr, rendezvous, listening) -> None:
    params = probe_params(s, request, master_addr, rendezvous, listening)
    with open(PROBE_SOURCE_PATH, "rb") as f:
        source = f.read()
    command = f"{shlex.quote(request.remote_python)} -c {shlex.quote(BOOTSTRAP)}"
    process = s.session.start(command, request.probe_timeout)
    try:
        process.write(json.dumps(params).encode() + b"\n" + str(len(source)).encode()
                      + b"\n" + source)
        if not params["listen"]:
            process.close_stdin()
    except (OSError, EOFError):  # the remote side is gone already (python not found): rc says why
        pass
    deadline = time.monotonic() + request.probe_timeout
    try:
        while True:
            line = process.readline(max(0.1, deadline - time.monotonic()))
            if line is None:
                break
            event = _event(line)
            if event.get("event") == "listening":
                s.listening = event
                listening.report(bool(event.get("ok")), int(event.get("port") or 0))
            elif event.get("event") == "result":
                s.result = event
                break
    except socket.timeout:
        pass
    if params["listen"] and s.result is not None:
        s.process = process  # kept open: the listener runs until _close_listener
        return
    rc, stderr = _wait(process)
    if s.result is None:
        s.checks.append(C.probe_failed(request.remote_python, rc, stderr, s.host.name))


def _event(line: bytes) -> dict:
    try:
        event = json.loads(line.decode(errors="replace"))
        return event if isinstance(event, dict) else {}
    except ValueError:
        return {}


def _wait(process) -> tuple[int | None, str]:
    try:
        return process.wait(2.0)
    except (socket.timeout, OSError):
        return None, ""


def _close_listener(first: HostState, request) -> set[str] | None:
    """Stop the first node's listener; the tokens it received, or None when it never ran."""
    if first.process is None:
        return None
    try:
        first.process.close_stdin()
        while True:
            line = first.process.readline(request.timeout)
            if line is None:
                return None
            event = _event(line)
            if event.get("event") == "tokens":
                return set(event.get("tokens") or [])
    except (socket.timeout, OSError):
        return None
    finally:
        first.session.close()


def version_problems(states, local_version) -> dict[str, dict]:
    """Cross-host findings per index: python minor, torch, dslaunch vs the launcher's own."""
    def values(pick):
        return {s.index: pick(s.result) for s in states if s.result is not None}

    python = values(lambda r: C.minor((r.get("python") or {}).get("version")))
    torch = values(lambda r: (r.get("torch") or {}).get("version"))
    dslaunch = values(lambda r: (r.get("dslaunch") or {}).get("version"))
    names = {s.index: s.host.name for s in states}

    def by_index(found: dict, reference=None, what="") -> dict:
        named = C.compare_versions({names[i]: v for i, v in found.items()}, reference, what)
        return {i: named[names[i]] for i in found}

    return {"python": by_index(python, what="python"), "torch": by_index(torch, what="torch"),
            "dslaunch": by_index(dslaunch, local_version, what="dslaunch")}

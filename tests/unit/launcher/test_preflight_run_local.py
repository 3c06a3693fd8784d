"""run_preflight end to end with a local stand-in for ssh: each "host" runs the real probe
in a local subprocess, so the orchestration (listener, tokens, versions) is exercised
without root or sshd. The cluster tests do the same through real sshd."""
import queue
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

from launcher.preflight import PreflightRequest, run_preflight
from launcher.preflight.target import SshTarget


@dataclass
class Host:
    name: str
    slots: int = 2
    user: str = None
    port: int = None
    line: int = 0


class LocalProcess:
    def __init__(self, command):
        self.proc = subprocess.Popen(["bash", "-c", command], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip(b"\n"))
        self.lines.put(None)

    def write(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self):
        self.proc.stdin.close()

    def readline(self, timeout):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise socket.timeout("remote command")

    def wait(self, timeout):
        rc = self.proc.wait(timeout)
        return rc, self.proc.stderr.read().decode()


class LocalSession:
    auth = "local stand-in"

    def start(self, command, timeout):
        return LocalProcess(command)

    def close(self):
        pass


class LocalConnector:
    """'Hosts' named refused-* fail like a stopped sshd; the others run locally."""

    def connect(self, target, timeout):
        if target.alias.startswith("refused"):
            raise ConnectionRefusedError(111, "Connection refused")
        return LocalSession()


def resolve(alias, user, port, timeout):
    return SshTarget(alias=alias, hostname="127.0.0.1", port=port or 22, user=user)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(hosts, **kw):
    kw.setdefault("master_port", free_port())
    kw.setdefault("remote_python", sys.executable)
    return run_preflight([Host(h) for h in hosts], PreflightRequest(launcher="local", **kw),
                         connector=LocalConnector(), resolve=resolve)


def test_all_good_hosts_pass_every_check(tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    report = check(["a", "b"], workdir=str(tmp_path), script="train.py")
    assert report.ok, report.format_table()
    names = [c.name for c in report.host("a").checks]
    assert names == ["ssh", "python", "torch", "dslaunch", "gpus", "workdir", "script",
                     "master_port", "rendezvous"]
    assert [c.name for c in report.host("b").checks][-1] == "rendezvous"
    assert "127.0.0.1" in report.host("b").check("rendezvous").detail


def test_a_refused_host_fails_alone_and_the_rest_still_run():
    report = check(["a", "refused-b", "c"])
    assert [h.host for h in report.failed_hosts] == ["refused-b"]
    assert "connection refused" in report.host("refused-b").check("ssh").detail
    assert report.host("c").check("rendezvous").ok


def test_first_host_refused_unblocks_the_others():
    report = check(["refused-a", "b"], timeout=1.0)
    assert not report.host("refused-a").ok
    assert report.host("b").check("rendezvous") is None  # nobody listened
    assert report.host("b").ok


def test_taken_master_port_is_named_with_its_owner():
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = holder.getsockname()[1]
        report = check(["a", "b"], master_port=port)
    taken = report.host("a").check("master_port")
    assert not taken.ok and f"port {port} is taken on a" in taken.detail
    assert "python" in taken.detail  # the owner (this test's interpreter) is named


def test_missing_remote_python_is_a_python_failure_on_every_host():
    report = check(["a", "b"], remote_python="/nonexistent/python3")
    for host in report.hosts:
        assert [c.name for c in host.checks] == ["ssh", "python"]
        assert "not found" in host.check("python").detail
        assert "--remote_python" in host.check("python").hint


def test_missing_workdir_and_script(tmp_path):
    report = check(["a"], workdir=str(tmp_path / "nope"), script="train.py")
    assert not report.host("a").check("workdir").ok
    assert not report.host("a").check("script").ok


def test_fast_path_runs_only_ssh_versions_workdir_and_rendezvous():
    report = check(["a", "b"], fast=True, script="missing.py")
    assert report.ok, report.format_table()
    assert [c.name for c in report.host("a").checks] == ["ssh", "python", "torch", "dslaunch",
                                                        "workdir", "master_port", "rendezvous"]


def test_master_port_zero_checks_the_path_with_a_port_the_first_node_picks():
    report = check(["a", "b"], master_port=0)
    assert report.ok, report.format_table()
    assert "free ports exist on a (the check listened on " in report.host("a").check("master_port").detail
    assert report.host("b").check("rendezvous").ok


def test_rendezvous_off():
    report = check(["a", "b"], rendezvous=False)
    assert report.ok
    assert report.host("a").check("master_port") is None
    assert report.host("b").check("rendezvous") is None


def test_no_hosts_is_not_ok():
    assert not run_preflight([], PreflightRequest(), connector=LocalConnector()).ok

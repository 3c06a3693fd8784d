"""Preflight against the real test cluster: paramiko talks to real sshd in namespaces.

Each broken node must be reported with its own reason and hint while good hosts pass.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

import pytest

from launcher.planning.hostfile import parse_hostfile
from launcher.preflight import PreflightRequest, run_preflight
from launcher.preflight.target import resolve_target

PORT = 29517  # not 29500: a dev box may run other jobs


def hosts_of(path):
    return parse_hostfile(path.read_text(), str(path))


def check(path, **kw):
    kw.setdefault("master_port", PORT)
    kw.setdefault("launcher", "pdsh")
    started = time.monotonic()
    report = run_preflight(hosts_of(path), PreflightRequest(**kw))
    return report, time.monotonic() - started


def failed(report):
    return {h.host: [c.name for c in h.checks if not c.ok] for h in report.failed_hosts}


@pytest.mark.timing
def test_healthy_cluster_passes_in_a_few_seconds(cluster_hostfile, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    report, elapsed = check(cluster_hostfile(3), workdir=str(tmp_path), script="train.py")
    assert report.ok, report.format_table()
    print(f"\nhealthy 3-node check: {elapsed:.2f} s")
    assert elapsed < 15.0   # ~1-2 s on an idle box; a guard against a check that stalls
    for k, host in enumerate(report.hosts, start=1):
        assert host.host == f"node{k}"
        names = [c.name for c in host.checks]
        for name in ("pdsh", "ssh", "python", "torch", "dslaunch", "gpus", "workdir", "script",
                     "rendezvous"):
            assert name in names, (host.host, names)
        assert f"root@10.213.0.{k}:22" in host.check("ssh").detail
        assert f"via eth0 (10.213.0.{k})" in host.check("rendezvous").detail
        assert host.check("gpus").warning  # CPU-only nodes pass with a warning
    assert report.host("node1").check("master_port").ok


def test_stopped_sshd_is_connection_refused(healthy_cluster, cluster_hostfile):
    with healthy_cluster.broken(2, "stop"):
        report, _ = check(cluster_hostfile(3))
    assert failed(report) == {"node2": ["ssh"]}
    ssh = report.host("node2").check("ssh")
    assert "connection refused by 10.213.0.2:22" in ssh.detail
    assert "start sshd on node2" in ssh.hint


def test_sshd_accepting_none_of_our_keys_is_an_auth_failure(healthy_cluster, cluster_hostfile):
    with healthy_cluster.broken(3, "lock"):
        report, _ = check(cluster_hostfile(3))
    assert failed(report) == {"node3": ["ssh"]}
    ssh = report.host("node3").check("ssh")
    assert "authentication failed for root@10.213.0.3:22" in ssh.detail
    assert "server allows: publickey" in ssh.detail and "id_ed25519" in ssh.detail
    assert ssh.hint.startswith("install your public key on node3: ssh-copy-id -i ")


@pytest.mark.timing
def test_two_broken_nodes_named_with_different_reasons_well_under_15_s(healthy_cluster,
                                                                      cluster_hostfile):
    with healthy_cluster.broken(2, "stop"), healthy_cluster.broken(3, "cut"):
        report, elapsed = check(cluster_hostfile(3))
    print(f"\n3 nodes, 2 broken (stopped, cut): {elapsed:.2f} s")
    assert failed(report) == {"node2": ["ssh"], "node3": ["ssh"]}
    assert "refused" in report.host("node2").check("ssh").detail
    cut = report.host("node3").check("ssh").detail  # ARP state decides which one we get
    assert "timed out after 5 s" in cut or "10.213.0.3:22 is unreachable" in cut, cut
    assert report.host("node1").ok
    assert elapsed < 15.0  # one 5 s timeout (node3's), never a second one after it


def test_wrong_remote_python(cluster_hostfile):
    report, _ = check(cluster_hostfile(2), remote_python="/opt/nope/bin/python3")
    for host in report.hosts:
        assert host.check("ssh").ok
        python = host.check("python")
        assert not python.ok and "'/opt/nope/bin/python3' not found" in python.detail
        assert "--remote_python" in python.hint


def test_master_port_taken_on_the_first_node(healthy_cluster, cluster_hostfile):
    with healthy_cluster.port_taken(1, PORT):
        report, _ = check(cluster_hostfile(3))
    assert failed(report) == {"node1": ["master_port"]}
    port = report.host("node1").check("master_port")
    assert f"port {PORT} is taken on node1 by pid" in port.detail
    assert "--master_port" in port.hint


def test_wrong_master_addr_fails_the_rendezvous_everywhere(cluster_hostfile):
    # 10.213.0.254 is the launcher's side of the bridge: reachable, but nobody listens there
    report, _ = check(cluster_hostfile(2), master_addr="10.213.0.254")
    for host in report.hosts:
        rendezvous = host.check("rendezvous")
        assert not rendezvous.ok and "cannot connect to 10.213.0.254" in rendezvous.detail


def test_unknown_and_changed_host_keys(cluster_hostfile, tmp_path):
    """known_hosts without node1, and with a wrong key for node2: never accepted."""
    empty = tmp_path / "known_empty"
    empty.write_text("")
    wrong = tmp_path / "known_wrong"
    other = (tmp_path / "k")
    os.system(f"ssh-keygen -q -t ed25519 -N '' -f {other}")
    wrong.write_text(f"10.213.0.2 {' '.join(open(str(other) + '.pub').read().split()[:2])}\n")
    files = {"node1": (str(empty),), "node2": (str(wrong),)}

    def resolve(alias, user, port, timeout):
        target = resolve_target(alias, user, port, timeout)
        return replace(target, known_hosts_files=files.get(alias, target.known_hosts_files))

    hosts = hosts_of(cluster_hostfile(3))
    report = run_preflight(hosts, PreflightRequest(master_port=PORT), resolve=resolve)
    assert failed(report) == {"node1": ["ssh"], "node2": ["ssh"]}
    unknown = report.host("node1").check("ssh")
    assert "host key of 10.213.0.1:22 is not in known_hosts (ssh-ed25519 SHA256:" in unknown.detail
    assert f"ssh-keyscan 10.213.0.1 >> {empty}" in unknown.hint
    changed = report.host("node2").check("ssh")
    assert "HOST KEY CHANGED for 10.213.0.2:22" in changed.detail
    assert "ssh-keygen -R 10.213.0.2" in changed.hint
    assert report.host("node3").ok
    assert empty.read_text() == ""  # nothing was added


def test_unresolvable_name(cluster_hostfile, tmp_path):
    path = tmp_path / "hosts"
    path.write_text(cluster_hostfile(1).read_text() + "no-such-node.invalid slots=2\n")
    report, _ = check(path)
    assert failed(report) == {"no-such-node.invalid": ["ssh"]}
    assert "does not resolve" in report.host("no-such-node.invalid").check("ssh").detail


@pytest.mark.timing
def test_fast_path_is_fast(cluster_hostfile):
    report, elapsed = check(cluster_hostfile(2), fast=True)
    assert report.ok, report.format_table()
    print(f"\nfast 2-node check: {elapsed:.2f} s")
    assert [c.name for c in report.host("node2").checks] == [
        "pdsh", "ssh", "python", "torch", "dslaunch", "workdir", "rendezvous"]
    assert elapsed < 10.0   # under a second on an idle box


@pytest.mark.timing
def test_sixteen_hosts_time_out_together_not_one_after_another(healthy_cluster):
    """16 entries for a cut node with a 2 s timeout: in parallel that is ~2 s, in series 32 s."""
    from launcher.planning.hostfile import Host

    hosts = [Host(name="10.213.0.3", slots=1, line=i + 1) for i in range(16)]
    with healthy_cluster.broken(3, "cut"):
        report = run_preflight(hosts, PreflightRequest(master_port=0, fast=True, timeout=2.0))
    print(f"\n16 unreachable hosts, 2 s timeout: {report.elapsed_s:.2f} s")
    assert len(report.failed_hosts) == 16
    assert report.elapsed_s < 16.0   # half of what one after another takes at the least


@pytest.mark.timing
def test_sixteen_healthy_hosts_are_checked_in_parallel(healthy_cluster):
    from launcher.planning.hostfile import Host

    sixteen = [Host(name=f"10.213.0.{1 + i % 3}", slots=1, line=i + 1) for i in range(16)]
    report = run_preflight(sixteen, PreflightRequest(master_port=PORT, fast=True))
    assert report.ok, report.format_table()
    print(f"\n16 healthy hosts (3 nodes by address): {report.elapsed_s:.2f} s")
    assert report.elapsed_s < 40.0  # CPU-bound here: 16 remote shells on 2 shared cores


def test_user_at_host_port_and_ssh_port_are_honoured(cluster_hostfile, tmp_path):
    path = tmp_path / "hosts"
    path.write_text("root@node1:22 slots=2\nnode2 slots=2\n")
    report, _ = check(path, ssh_port=2222)  # the hostfile's :22 wins over --ssh_port for node1
    assert report.host("node1").check("ssh").detail.startswith("root@10.213.0.1:22 ")
    node2 = report.host("node2").check("ssh")
    assert not node2.ok and "connection refused by 10.213.0.2:2222" in node2.detail
    assert "--ssh_port" in node2.hint


def test_keys_from_the_agent(cluster_hostfile, tmp_path, monkeypatch):
    """No identity file: the key comes from a real ssh-agent (SSH_AUTH_SOCK)."""
    import re
    import signal
    import subprocess

    sock = tmp_path / "agent.sock"
    out = subprocess.run(["ssh-agent", "-a", str(sock)], capture_output=True, text=True, check=True)
    agent_pid = int(re.search(r"SSH_AGENT_PID=(\d+)", out.stdout).group(1))
    try:
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", "-q", "/run/dslaunch-cluster/id_ed25519"], env=env, check=True,
                       capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))

        def resolve(alias, user, port, timeout):
            target = resolve_target(alias, user, port, timeout)
            return replace(target, identity_files=(), identities_only=False)

        hosts = hosts_of(cluster_hostfile(2))
        report = run_preflight(hosts, PreflightRequest(master_port=PORT, fast=True), resolve=resolve)
        assert report.ok, report.format_table()
        assert "(key agent key ssh-ed25519)" in report.host("node2").check("ssh").detail
        monkeypatch.delenv("SSH_AUTH_SOCK")
        report = run_preflight(hosts, PreflightRequest(master_port=PORT, fast=True), resolve=resolve)
        auth = report.host("node1").check("ssh")
        assert not auth.ok and "tried: no keys (none found, no agent)" in auth.detail
    finally:
        os.kill(agent_pid, signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))

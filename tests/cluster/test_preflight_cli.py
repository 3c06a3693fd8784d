"""`dslaunch --check` and the pre-launch preflight through the real CLI on the test cluster."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def dslaunch(*args, timeout=60, cwd=REPO):
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "launcher", *map(str, args)], capture_output=True,
                         text=True, timeout=timeout, cwd=cwd)
    return out, time.monotonic() - started


@pytest.mark.timing
def test_check_on_a_healthy_cluster_exits_0_in_a_few_seconds(cluster_hostfile):
    out, elapsed = dslaunch("--hostfile", cluster_hostfile(3), "--check", "--master_port", 29518)
    print(f"\ndslaunch --check, 3 healthy nodes: {elapsed:.2f} s")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "preflight ok: 3 host(s) passed every check" in out.stdout
    assert "Traceback" not in out.stderr
    assert elapsed < 20.0   # ~2-3 s on an idle box; a guard against a check that stalls, not a benchmark


@pytest.mark.timing
def test_check_with_two_broken_nodes_exits_3_naming_both(healthy_cluster, cluster_hostfile):
    hostfile = cluster_hostfile(3)
    with healthy_cluster.broken(2, "stop"), healthy_cluster.broken(3, "lock"):
        out, elapsed = dslaunch("--hostfile", hostfile, "--check", "--master_port", 29518)
    print(f"\ndslaunch --check, 3 nodes, 2 broken: {elapsed:.2f} s")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "preflight failed on 2 of 3 host(s): node2, node3" in out.stdout
    assert "node2 ssh: connection refused by 10.213.0.2:22" in out.stdout
    assert "node3 ssh: authentication failed for root@10.213.0.3:22" in out.stdout
    assert "hint: install your public key on node3: ssh-copy-id" in out.stdout
    assert "Traceback" not in out.stderr
    assert elapsed < 30.0   # refused and auth failure answer at once: no timeout is waited out


def test_check_json_is_the_contract_document(healthy_cluster, cluster_hostfile):
    with healthy_cluster.broken(2, "stop"):
        out, _ = dslaunch("--hostfile", cluster_hostfile(2), "--check", "--json",
                          "--master_port", 29518)
    assert out.returncode == 3
    doc = json.loads(out.stdout)
    assert doc["ok"] is False
    assert [(h["host"], h["ok"]) for h in doc["hosts"]] == [("node1", True), ("node2", False)]
    for host in doc["hosts"]:
        for check in host["checks"]:
            assert set(check) == {"name", "ok", "detail", "hint"}
    names = {c["name"] for c in doc["hosts"][0]["checks"]}
    assert {"ssh", "python", "torch", "dslaunch", "gpus", "workdir", "master_port"} <= names
    failed = [c for c in doc["hosts"][1]["checks"] if not c["ok"]]
    assert [c["name"] for c in failed] == ["ssh"] and "refused" in failed[0]["detail"]


def test_a_launch_stops_before_starting_anything_when_a_node_fails(healthy_cluster,
                                                                   cluster_hostfile, tmp_path):
    marker = tmp_path / "started"
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(marker)!r} + __import__('os').environ['RANK'], 'w').close()\n")
    with healthy_cluster.broken(2, "lock"):
        out, _ = dslaunch("--hostfile", cluster_hostfile(2), "--master_port", 29518, script,
                          cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "node2" in out.stderr and "authentication failed" in out.stderr
    assert not list(tmp_path.glob("started*"))  # not even node1's ranks ran


def _touch_script(tmp_path):
    script = tmp_path / "touch.py"
    script.write_text(f"open({str(tmp_path / 'started')!r} + __import__('os').environ['RANK'], 'w').close()\n")
    return script


def test_the_agents_catch_a_taken_master_port_before_any_rank_starts(healthy_cluster, cluster_hostfile,
                                                                     tmp_path):
    with healthy_cluster.port_taken(1, 29519):
        out, _ = dslaunch("--hostfile", cluster_hostfile(2), "--master_port", 29519, _touch_script(tmp_path),
                          cwd=tmp_path)
    assert out.returncode == 3, out.stdout + out.stderr
    assert "preflight failed: nothing was started on any node" in out.stderr
    assert "master_port" in out.stderr and "port 29519 is taken on node1" in out.stderr
    assert "node2  rendezvous" not in out.stderr  # nobody was asked to connect to a port that is taken
    assert not list(tmp_path.glob("started*"))


def test_a_healthy_launch_checks_through_the_agents_without_a_second_ssh(cluster_hostfile, tmp_path):
    """The pre-launch checks ride on the agents' channels: no paramiko, no extra ssh per node."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", "--hostfile",
                          str(cluster_hostfile(2)), "--master_port", "29520", str(_touch_script(tmp_path))],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "launcher.preflight.via_agents" in imported  # the checks ran...
    assert "paramiko" not in imported  # ...without an ssh connection of their own
    assert "dslaunch: preflight ok: 2 node(s) passed in" in out.stderr
    assert sorted(p.name for p in tmp_path.glob("started*")) == ["started0", "started1", "started2", "started3"]

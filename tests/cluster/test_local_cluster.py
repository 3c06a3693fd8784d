"""scripts/local-cluster itself: names, ssh, pdsh and mpirun across nodes; breaking and healing."""
import shutil
import subprocess

import pytest


def sh(*argv, timeout=30, **kw):
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kw)


def test_plain_ssh_reaches_every_node_by_name_and_nodes_reach_each_other(healthy_cluster):
    for k in range(1, healthy_cluster.nodes + 1):
        out = sh("ssh", "-o", "BatchMode=yes", f"node{k}", "hostname; hostname -I")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [f"node{k}", f"10.213.0.{k}"]
    hop = sh("ssh", "-o", "BatchMode=yes", "node1", "ssh -o BatchMode=yes node2 hostname")
    assert hop.stdout.strip() == "node2", hop.stderr


def test_host_keys_are_checked_not_skipped(healthy_cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    out = sh("ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={empty}", "node1", "true")
    assert out.returncode == 255 and "Host key verification failed" in out.stderr


@pytest.mark.skipif(not shutil.which("pdsh"), reason="pdsh not installed")
def test_pdsh_over_ssh(healthy_cluster):
    out = sh("pdsh", "-R", "ssh", "-S", "-w", "node1,node2,node3", "hostname")
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.splitlines()) == ["node1: node1", "node2: node2", "node3: node3"]


@pytest.mark.skipif(not shutil.which("mpirun"), reason="openmpi not installed")
def test_mpirun_across_nodes(healthy_cluster):
    out = sh("mpirun", "--allow-run-as-root", "--mca", "plm_rsh_agent", "ssh",
             "--mca", "oob_tcp_if_include", "10.213.0.0/24",
             "--mca", "btl_tcp_if_include", "10.213.0.0/24",
             "-H", "node1:2,node2:2", "sh", "-c", "echo $(hostname) $OMPI_COMM_WORLD_RANK",
             timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:-1]) == ["node1 0", "node1 1", "node2 2", "node2 3"]


def test_stop_lock_cut_break_a_node_and_restore_heals_it(healthy_cluster):
    def ssh2():
        return sh("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2", "node2", "true")

    with healthy_cluster.broken(2, "stop"):
        assert "Connection refused" in ssh2().stderr
    with healthy_cluster.broken(2, "lock"):
        assert "Permission denied (publickey)" in ssh2().stderr
    with healthy_cluster.broken(2, "cut"):
        assert "timed out" in ssh2().stderr
    assert ssh2().returncode == 0


def test_status_lists_the_nodes(healthy_cluster):
    out = healthy_cluster.script("status").stdout
    for k in range(1, healthy_cluster.nodes + 1):
        assert f"node{k}   10.213.0.{k}    sshd running  link up" in out

"""The real test cluster (scripts/local-cluster) for tests/cluster: up once per session.

Every test here is marked `cluster`. Without root or the tools (ip, sshd, ssh, unshare)
they are skipped. A cluster that is already up (CI runs `scripts/local-cluster up 3`
first) is reused and left up; one this session started is taken down at the end
(set DSL_CLUSTER_KEEP=1 to keep it).

Fixtures:
  cluster           the Cluster (node count, paths, break/restore helpers)
  healthy_cluster   the same, after putting every node back to healthy
  cluster_hostfile  factory: cluster_hostfile(n=3, slots=2) -> path of a hostfile for nodes 1..n
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "local-cluster"
STATE = Path(os.environ.get("DSL_CLUSTER_DIR", "/run/dslaunch-cluster"))
NODES = 3
TOOLS = ("ip", "ssh", "ssh-keygen", "unshare", "/usr/sbin/sshd")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


class Cluster:
    """Nodes node1..N at 10.213.0.K; methods break one node and put it back."""

    def __init__(self, nodes: int, state: Path = STATE):
        self.nodes = nodes
        self.state = state

    def address(self, k: int) -> str:
        return f"10.213.0.{k}"

    def script(self, *args: str) -> subprocess.CompletedProcess:
        """Run scripts/local-cluster with `args`; raises when it fails."""
        return subprocess.run([str(SCRIPT), *args], check=True, capture_output=True, text=True,
                              timeout=60)

    def stop(self, k: int) -> None:
        self.script("stop", str(k))

    def start(self, k: int) -> None:
        self.script("start", str(k))

    def lock(self, k: int) -> None:
        self.script("lock", str(k))

    def unlock(self, k: int) -> None:
        self.script("unlock", str(k))

    def cut(self, k: int) -> None:
        self.script("cut", str(k))

    def heal(self, k: int) -> None:
        self.script("heal", str(k))

    def restore(self, k: int) -> None:
        """Node k healthy again: on the network, sshd running and accepting our key."""
        self.heal(k)
        if (self.state / f"n{k}" / "locked").exists():
            self.unlock(k)
        else:
            self.start(k)

    @contextlib.contextmanager
    def broken(self, k: int, how: str):
        """with cluster.broken(2, "stop"): ... node 2 is broken inside, restored after."""
        {"stop": self.stop, "lock": self.lock, "cut": self.cut}[how](k)
        try:
            yield
        finally:
            self.restore(k)

    def popen(self, k: int, argv: list[str], **kw) -> subprocess.Popen:
        """Start a process on node k (inside its network namespace)."""
        return subprocess.Popen(["ip", "netns", "exec", f"dsl-n{k}", *argv], **kw)

    @contextlib.contextmanager
    def port_taken(self, k: int, port: int):
        """Something listens on `port` on node k for the duration."""
        code = ("import socket,time;s=socket.socket();"
                "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('',%d));"
                "s.listen();print('ready',flush=True);time.sleep(120)" % port)
        proc = self.popen(k, ["python3", "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            yield proc
        finally:
            proc.kill()
            proc.wait()

    def hostfile(self, path: Path, n: int | None = None, slots: int = 2) -> Path:
        n = self.nodes if n is None else n
        path.write_text("".join(f"node{k} slots={slots}\n" for k in range(1, n + 1)))
        return path


def _why_not() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the test cluster needs root (network namespaces, sshd)"
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        return f"the test cluster needs {', '.join(missing)} (apt-get install iproute2 openssh-server)"
    return None


def _is_up(nodes: int) -> bool:
    try:
        count = int((STATE / "nodes").read_text())
    except (OSError, ValueError):
        return False
    if count < nodes:
        return False
    ok = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "node1", "true"],
                        capture_output=True, timeout=20)
    return ok.returncode == 0


@pytest.fixture(scope="session")
def cluster():
    why = _why_not()
    if why:
        pytest.skip(why)
    started = False
    if not _is_up(NODES):
        out = subprocess.run([str(SCRIPT), "up", str(NODES)], capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0:
            pytest.skip(f"scripts/local-cluster up {NODES} failed: {out.stderr.strip()[-500:]}")
        started = True
    count = int((STATE / "nodes").read_text())
    yield Cluster(count)
    if started and not os.environ.get("DSL_CLUSTER_KEEP"):
        subprocess.run([str(SCRIPT), "down"], capture_output=True, timeout=120)


@pytest.fixture
def healthy_cluster(cluster):
    for k in range(1, cluster.nodes + 1):
        cluster.restore(k)
    time.sleep(0.05)
    return cluster


@pytest.fixture
def cluster_hostfile(healthy_cluster, tmp_path):
    def make(n: int = NODES, slots: int = 2) -> Path:
        return healthy_cluster.hostfile(tmp_path / f"hostfile-{n}", n, slots)
    return make

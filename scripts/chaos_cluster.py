"""The chaos run's multi-node half (``scripts/chaos.py --cluster NAME``): the job on a cluster of
scripts/local-cluster of its own (``DSL_CLUSTER_NAME=NAME``), the faults only a cluster has, and
the checks that look at every node.

The cluster is NODES nodes of ``--slots`` ranks each (1 or 2) and the global batch BATCH, so the
job's world size before and after a node is lost (3 then 2, or 6 then 4) divides the batch. With one
rank a node the stuck rank is alone on its node, so only the job-wide ``--stall_timeout`` watch in
dslaunch can find it; the first 100-round table (benchmarks/RESULTS.md) was made with two a node,
before that watch existed, when one alone on its node went unnoticed (a hang). Every node shares this filesystem,
so the checkpoints a round writes are on it; the nodes' mount namespaces were copied when their
sshd started, so ``full_disk`` uses one tmpfs mounted before the cluster comes up and resized each
round (a tmpfs's size belongs to its superblock, which every copy shares).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "local-cluster")
NODES, BATCH = 3, 12
SLOTS = (1, 2)   # ranks a node that --slots takes
KINDS = {"kill_agent": 0, "cut_link": 0, "sshd_stopped": 0}   # each ends on the survivors: exit 0


class ChaosCluster:
    """Cluster NAME: brought up (with the tmpfs under it), healed between rounds, searched for leftovers."""

    def __init__(self, name: str, launchers: list[str], slots: int = 1):
        self.name = name
        self.slots = slots
        self.launchers = launchers
        self.state = f"/run/dslaunch-cluster-{name}"
        self.disk = f"/run/dslaunch-chaos-disk-{name}"
        self.env = {**os.environ, "DSL_CLUSTER_NAME": name, "DSL_CLUSTER_DIR": self.state}
        self.hostfile = os.path.join(self.state, "chaos-hostfile")
        self.broken: list[tuple[str, int]] = []

    # ---- the cluster ---------------------------------------------------------------------------
    def script(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([SCRIPT, *args], env=self.env, capture_output=True, text=True, timeout=180,
                              check=check)

    def up(self) -> None:
        """A fresh cluster, the tmpfs mounted first so that every node sees it."""
        self.script("down")
        if subprocess.run(["mountpoint", "-q", self.disk]).returncode != 0:
            os.makedirs(self.disk, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", self.disk], check=True)
        self.script("up", str(NODES))
        with open(self.hostfile, "w", encoding="utf-8") as handle:
            handle.write("".join(f"{self.name}-node{k} slots={self.slots}\n" for k in range(1, NODES + 1)))

    def down(self) -> None:
        self.script("down", check=False)
        subprocess.run(["umount", "-l", self.disk], check=False)
        try:
            os.rmdir(self.disk)
        except OSError:
            pass

    def restore(self) -> str | None:
        """Every node healed and its sshd running; a cluster that does not answer is made anew.
        Returns what was wrong, or None."""
        for what, k in self.broken:
            self.script("heal" if what == "cut" else "start", str(k), check=False)
        self.broken = []
        dead = [k for k in range(1, NODES + 1) if not self._answers(k)]
        if not dead:
            return None
        self.up()
        return f"node(s) {dead} did not answer ssh after the round: cluster made anew"

    def _answers(self, k: int) -> bool:
        done = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", f"{self.name}-node{k}", "true"],
                              capture_output=True, timeout=30)
        return done.returncode == 0

    def cut(self, k: int) -> None:
        self.broken.append(("cut", k))
        self.script("cut", str(k))

    def stop_sshd(self, k: int) -> None:
        self.broken.append(("stop", k))
        self.script("stop", str(k))

    # ---- a round ---------------------------------------------------------------------------------
    def argv(self, python: str, tag: str, launcher: str, extra_env: dict[str, str]) -> list[str]:
        env = [f"--env={key}={value}" for key, value in {"DSLAUNCH_CHAOS": tag, "CHAOS_BATCH": BATCH,
                                                          **extra_env}.items()]
        return [python, "-m", "launcher", "-H", self.hostfile, "--launcher", launcher, "--master_port", "0",
                "--no_local_rank", "--max_restarts", "2", "--min_nodes", "2", "--heartbeat_timeout", "3",
                "--stall_timeout", "6", *env]

    def full_disk(self, directory: str, kib: int) -> str:
        """`directory`/ckpt is a link to an empty folder on the tmpfs, which now holds `kib` KiB."""
        for name in os.listdir(self.disk):
            shutil.rmtree(os.path.join(self.disk, name), ignore_errors=True)
        subprocess.run(["mount", "-o", f"remount,size={kib}k", self.disk], check=True)
        target = os.path.join(self.disk, "ckpt")
        os.makedirs(target)
        os.symlink(target, os.path.join(directory, "ckpt"))
        return target

    def namespaces(self) -> list[str]:
        return [f"dsl-{self.name}-n{k}" for k in range(1, NODES + 1)]

    def leftovers(self) -> dict[int, str]:
        """pid -> 'node: command' of every process inside a node that is not the node's sshd listener
        (the namespaces share this machine's pid space, so /proc sees them; `ip netns pids` says where)."""
        listeners = set()
        for k in range(1, NODES + 1):
            try:
                with open(os.path.join(self.state, f"n{k}", "sshd.pid"), encoding="utf-8") as handle:
                    listeners.add(int(handle.read().strip()))
            except (OSError, ValueError):
                pass
        found = {}
        for ns in self.namespaces():
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in map(int, pids):
                if pid not in listeners:
                    found[pid] = f"{ns}: {_cmdline(pid)}"
        return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:160]
    except OSError:
        return "?"


def agent_of(rank_pid: int) -> int | None:
    """The pid of the agent that started this rank (its parent), or None."""
    try:
        with open(f"/proc/{rank_pid}/stat", encoding="utf-8") as handle:
            parent = int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return parent if "launcher.agent" in _cmdline(parent) else None


def inject(kind: str, cluster: ChaosCluster, pids: list[int], rng) -> str:
    """A cluster-only fault against the running job (ranks `pids`); returns what was done."""
    if kind == "kill_agent":
        agent = agent_of(rng.choice(pids)) if pids else None
        if agent is None:
            return "no agent found"
        os.kill(agent, signal.SIGKILL)
        return f"SIGKILL agent {agent}"
    k = rng.randrange(1, NODES + 1)
    if kind == "cut_link":
        cluster.cut(k)
        return f"cut node {k}"
    if kind == "sshd_stopped":   # then a rank fault forces a restart, which cannot reach node k
        cluster.stop_sshd(k)
        victim = rng.choice(pids)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return f"sshd of node {k} stopped, rank pid {victim} killed"
    raise ValueError(kind)

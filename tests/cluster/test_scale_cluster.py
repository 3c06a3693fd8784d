"""32 real nodes (1 slot each): every rank runs once, and one failure stops every node quickly.

The session's cluster has 3 nodes; this module brings up 32 for its tests and puts the
cluster back to the size it found after, so the other modules see what they expect.
Nodes share this machine's PID space and filesystem, so the ranks' pids and start files
are checked from here.
"""
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(ROOT, "scripts", "local-cluster")
NODES = 32
# issue 15's target, first failure to every node stopped, is 2 s (an idle box does it in under
# one); as a test, a wide margin: a stop that waits out a timeout or goes node after node is slower
STOP_BOUND_S = 10.0
JOB = """import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
work, mode = sys.argv[1:3]

def publish(name, text):   # whole or not at all: a reader never sees an empty file
    with open(os.path.join(work, "." + name), "w") as f:
        f.write(text)
    os.replace(os.path.join(work, "." + name), os.path.join(work, name))

publish(f"start.{rank}", str(os.getpid()))
print(f"rank {rank} of {world} on {socket.gethostname()}", flush=True)
if mode == "fail":
    if rank == world - 1:   # fails once every rank runs, so the stop reaches running ranks everywhere
        while len([n for n in os.listdir(work) if n.startswith("start.")]) < world:
            time.sleep(0.02)
        publish("failed_at", repr(time.time()))
        sys.exit(1)
    time.sleep(120)
"""


@pytest.fixture(scope="module")
def hosts32(cluster, tmp_path_factory):
    before = cluster.nodes
    up = subprocess.run([CLUSTER, "up", str(NODES)], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr[-500:]
    work = tmp_path_factory.mktemp("scale")
    (work / "job.py").write_text(JOB)
    (work / "hosts").write_text("".join(f"node{k} slots=1\n" for k in range(1, NODES + 1)))
    yield work
    subprocess.run([CLUSTER, "up", str(before)], capture_output=True, text=True, timeout=300)


def start(work, runner, mode):
    run = work / f"{runner}-{mode}"
    run.mkdir()
    argv = [sys.executable, "-m", "launcher", "-H", str(work / "hosts"), "--launcher", runner,
            "--no-preflight", "--no_local_rank", str(work / "job.py"), str(run), mode]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT), run


def rank_pids(run):
    return [int((run / name).read_text()) for name in os.listdir(run) if name.startswith("start.")]


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def control_address(dslaunch):
    """The HOST:PORT dslaunch's agents dial (it is on every agent's command line, and no other
    job's: another dslaunch on this machine listens on its own cluster's address or port)."""
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            listening = psutil.Process(dslaunch.pid).net_connections("tcp")
            addresses = [f"{c.laddr.ip}:{c.laddr.port}" for c in listening if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            addresses = []
        if addresses:   # the nodes' side of the bridge, never a wildcard no agent line would name
            assert addresses[0].startswith("10.213.0.254:"), addresses
            return addresses[0]
        time.sleep(0.05)
    raise AssertionError("dslaunch never listened for its agents")


def agents_of(address):
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or ())
        if "launcher.agent" in line and re.search(rf"{re.escape(address)}\b", line) and alive(proc.pid):
            found.append(proc.pid)
    return found


@pytest.mark.parametrize("runner", ["ssh", "pdsh"])
def test_every_rank_on_32_nodes_runs_once(hosts32, runner):
    dslaunch, _ = start(hosts32, runner, "ok")
    out, err = dslaunch.communicate(timeout=180)
    assert dslaunch.returncode == 0, err[-800:]
    lines = re.findall(r"^\[rank (\d+)\] rank (\d+) of 32 on (node\d+)$", out, re.M)
    assert sorted(int(r) for r, _, _ in lines) == list(range(NODES))     # one line per rank, no more
    assert all(r == same for r, same, _ in lines)
    assert {host for _, _, host in lines} == {f"node{k}" for k in range(1, NODES + 1)}


@pytest.mark.timing
@pytest.mark.parametrize("runner", ["ssh", "pdsh"])
def test_one_failure_on_32_nodes_stops_every_rank_and_agent_quickly(hosts32, runner):
    dslaunch, run = start(hosts32, runner, "fail")
    address = control_address(dslaunch)
    deadline = time.time() + 150
    while not (run / "failed_at").exists() and dslaunch.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert (run / "failed_at").exists(), dslaunch.communicate(timeout=60)[1][-800:]
    failed = float((run / "failed_at").read_text())
    pids = rank_pids(run)
    while any(alive(p) for p in pids) and time.time() < failed + 60:
        time.sleep(0.01)
    took = time.time() - failed
    out, err = dslaunch.communicate(timeout=60)
    assert dslaunch.returncode == 1, err[-800:]
    assert len(pids) == NODES and [p for p in pids if alive(p)] == []
    assert took < STOP_BOUND_S, f"{took:.2f} s from the failure until every rank on every node was gone"
    assert "rank 31" in err   # the summary names the failed rank
    # each agent exits right after its "done"; dslaunch may return a moment before the last one
    # has. 30 s is the limit for "never", not a speed bound
    deadline = time.time() + 30
    while agents_of(address) and time.time() < deadline:
        time.sleep(0.05)
    assert agents_of(address) == [], "agents of the job still running after dslaunch exited"

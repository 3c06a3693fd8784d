"""Multi-node launches on the real test cluster (scripts/local-cluster): real sshd, pdsh, mpirun."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from launcher.errors import EXIT_NODE_LOST

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANKS = os.path.join(ROOT, "tests", "scripts", "ranks.py")
CLUSTER = os.path.join(ROOT, "scripts", "local-cluster")

pytestmark = pytest.mark.cluster


@pytest.fixture
def hosts(healthy_cluster, tmp_path):
    """Two healthy nodes of the test cluster (brought up by tests/cluster/conftest.py)."""
    return str(healthy_cluster.hostfile(tmp_path / "hosts", 2))


def dslaunch(*args, timeout=120, env=None):
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def start(*args, env=None):
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)


def rank_pids(text):
    return [int(m.group(1)) for m in re.finditer(r"\] pid (\d+) rank", text)]


def read_until(proc, count):
    seen = ""
    end = time.time() + 60
    while time.time() < end and len(rank_pids(seen)) < count:
        seen += proc.stdout.readline()
    return rank_pids(seen)


def alive(pids):
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def job_processes(marker):
    """Processes of this job on any node (namespaces share the pid space), found by a marker arg."""
    return [p.pid for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]


@pytest.mark.parametrize("launcher", ["ssh", "pdsh", "openmpi"])
def test_gloo_all_reduce_two_nodes_nothing_set_by_hand(hosts, launcher):
    done = dslaunch("-H", hosts, "--launcher", launcher, "--no-preflight", "examples/hello_dist.py")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "all_reduce sum = 10 (expected 10)" in line]
    assert len(lines) == 4
    assert {line.split(" on ")[1].split(":")[0] for line in lines} == {"node1", "node2"}


def test_forwarded_env_and_tricky_args_arrive_verbatim(hosts):
    value = 'a b $HOME "q" \'s\' ;*'
    env = {**os.environ, "NCCL_TEST_VALUE": value, "DSL_TEST_FORWARD": "not forwarded"}
    tricky = ["a b", "it's", "$HOME", "x;y", "*", '"q"']
    done = dslaunch("-H", hosts, "--launcher", "ssh", "--no-preflight", "--env", "DSL_TEST_ENV=" + value,
                    RANKS, "echo-args", *tricky, env=env)
    assert done.returncode == 0, done.stderr
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in done.stdout.splitlines() if "ENV " in line]
    argvs = [json.loads(line.split("ARGS ", 1)[1]) for line in done.stdout.splitlines() if "ARGS " in line]
    assert len(envs) == 4 and all(a[1:] == ["echo-args", *tricky] for a in argvs)
    by_rank = {e["RANK"]: e for e in envs}
    assert by_rank["3"]["NODE_RANK"] == "1" and by_rank["3"]["LOCAL_RANK"] == "1"
    assert all(e["NCCL_TEST_VALUE"] == value and e["DSL_TEST_ENV"] == value for e in envs)
    assert all(e["DSL_TEST_FORWARD"] is None for e in envs)
    assert {e["MASTER_ADDR"] for e in envs} == {"10.213.0.1"}
    assert all(e["GLOO_SOCKET_IFNAME"] and e["GLOO_SOCKET_IFNAME"] != "lo" for e in envs)


def test_env_values_never_on_a_command_line(hosts):
    secret = "sekrit-" + str(os.getpid())
    proc = start("-H", hosts, "--launcher", "ssh", "--no-preflight", "--env", "DSL_TEST_ENV=" + secret,
                 RANKS, "sleep", env={**os.environ, "NCCL_TEST_VALUE": secret + "-nccl"})
    try:
        assert len(read_until(proc, 4)) == 4
        others = [pid for pid in job_processes(secret) if pid != proc.pid]  # dslaunch's own argv has --env
        assert others == [], "a forwarded value showed up in a command line on a node"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)


def test_bind_cores_to_rank_splits_each_nodes_cores_by_local_rank(hosts):
    done = dslaunch("-H", hosts, "--launcher", "ssh", "--no-preflight", "--bind_cores_to_rank", RANKS, "affinity")
    assert done.returncode == 0, done.stderr
    found = [json.loads(line.split("AFFINITY ", 1)[1]) for line in done.stdout.splitlines() if "AFFINITY " in line]
    assert sorted(r["rank"] for r in found) == [0, 1, 2, 3]
    cores = sorted(os.sched_getaffinity(0))
    per = max(1, len(cores) // 2)   # 2 slots a node
    for r in found:
        want = cores[r["local_rank"] * per:(r["local_rank"] + 1) * per] if len(cores) >= 2 else cores
        assert r["cores"] == want and r["omp"] == str(len(want)), r


def test_every_rank_failing_alike_is_said_once_for_the_job(hosts):
    at = time.time() + 8   # after every rank started on both nodes
    done = dslaunch("-H", hosts, "--launcher", "ssh", "--no-preflight", RANKS, "all-fail", "3", str(at))
    assert done.returncode == 3, done.stderr
    assert "(all 4 ranks failed the same way)" in done.stderr, done.stderr
    assert "every other rank was stopped" not in done.stderr


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_crash_on_node2_stops_node1(hosts, launcher, tmp_path):
    started = tmp_path / "started"   # rank 3 fails once all 4 ranks on both nodes started
    started.mkdir()
    proc = start("-H", hosts, "--launcher", launcher, "--no-preflight", RANKS, "fail", "3", "9", str(started))
    pids = read_until(proc, 4)
    out, err = proc.communicate(timeout=150)
    assert proc.returncode == 9, err
    assert "rank 3 on node2 exited with code 9" in err and "failing on purpose" in err
    after_summary = err[err.index("rank 3 on node2 exited with code 9"):]
    assert f"[{launcher}" not in after_summary, err   # the runner's teardown lines do not bury the summary
    assert "slept 60 s unstopped" not in out   # every other rank, node1's too, was stopped, not left to finish
    assert alive(pids) == []   # each agent reaps its ranks before it reports "done" to dslaunch


@pytest.mark.timing
@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_sigkill_of_dslaunch_leaves_nothing(hosts, launcher):
    marker = f"orphan-check-{launcher}-{os.getpid()}"
    proc = start("-H", hosts, "--launcher", launcher, "--no-preflight", RANKS, "sleep", marker)
    pids = read_until(proc, 4)
    assert len(pids) == 4
    proc.kill()
    proc.wait()
    # each agent sees its socket close and stops its ranks (a 3 s grace); 30 s is the limit for
    # "never", half the ranks' own 60 s sleep
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (alive(pids) or job_processes(marker)):
        time.sleep(0.2)
    assert alive(pids) == [] and job_processes(marker) == []


def test_sigint_stops_every_node(hosts):
    proc = start("-H", hosts, "--launcher", "pdsh", "--no-preflight", RANKS, "sleep")
    pids = read_until(proc, 4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert out.count("interrupted") == 4
    assert alive(pids) == []


def test_master_port_zero_picks_a_free_port(hosts):
    done = dslaunch("-H", hosts, "--launcher", "ssh", "--no-preflight", "--master_port", "0",
                    RANKS, "echo-args")
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in done.stdout.splitlines() if "ENV " in line]
    ports = {e["MASTER_PORT"] for e in envs}
    assert len(envs) == 4 and len(ports) == 1 and ports != {"0"}


@pytest.mark.timing
def test_node_whose_network_is_cut_ends_the_job(hosts):
    proc = start("-H", hosts, "--launcher", "ssh", "--no-preflight", "--heartbeat_timeout", "3",
                 RANKS, "sleep")
    pids = read_until(proc, 4)
    subprocess.run([CLUSTER, "cut", "2"], check=True, capture_output=True)
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        subprocess.run([CLUSTER, "heal", "2"], check=True, capture_output=True)
    # the silence ended the job (its code and message), not the ranks' own 60 s: no clock needed
    assert proc.returncode == EXIT_NODE_LOST == 75, err  # its own documented code, not a rank's 1
    assert "node 1 (node2) stopped answering" in err
    # node2's agent, cut off, stops its own ranks once dslaunch is silent for 3 s (then a 3 s grace);
    # 30 s is the limit for "never", half the ranks' own 60 s sleep
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and alive(pids):
        time.sleep(0.2)
    assert alive(pids) == []


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_agent_that_cannot_start_is_named_quickly(hosts, launcher):
    done = dslaunch("-H", hosts, "--launcher", launcher, "--no-preflight", "--remote_python", "/nonexistent/py",
                    RANKS, "echo-args")
    assert done.returncode == 3
    # "quickly": named from the runner's own exit, not after the 60 s wait for a missing agent
    assert "could not start the agent" in done.stderr or "before the agent of" in done.stderr
    assert "after 60 s in which no new agent connected" not in done.stderr
    assert "/nonexistent/py: No such file or directory" in done.stderr


def test_preflight_failure_stops_the_launch_before_anything_starts(hosts):
    done = dslaunch("-H", hosts, "--launcher", "ssh", "--remote_python", "/nonexistent/py", RANKS, "echo-args")
    assert done.returncode == 3, done.stderr
    assert "preflight failed: nothing was started" in done.stderr
    # said once, with the table: not also as the runner's raw lines or "could not start the agent"
    assert "could not start the agent" not in done.stderr and "before the agent of" not in done.stderr
    assert "[ssh " not in done.stderr and done.stderr.count("preflight failed") == 2   # the table's line, ours
    assert "--no-preflight would not help" in done.stderr
    assert "ARGS" not in done.stdout


def test_a_config_error_on_two_nodes_is_one_message_for_the_job(hosts, tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 4, "zero_optimisation": {"stage": 2},
                                  "optimizer": {"type": "AdamW", "params": {}}}))
    worker = os.path.join(ROOT, "tests", "dist", "workers", "config_worker.py")
    done = dslaunch("-H", hosts, "--launcher", "ssh", "--no-preflight", "--no_local_rank", worker, str(config))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("unknown config key 'zero_optimisation'") == 1, done.stderr
    assert "[rank 0] dslaunch: config error:" in done.stderr and "did you mean 'zero_optimization'?" in done.stderr

"""`dslaunch --launcher slurm` inside real Slurm allocations (scripts/local-slurm on the test cluster).

Slurm here is Debian's slurmctld/slurmd 22.05: one slurmd per local-cluster node (nodeK in
namespace dsl-nK), so srun really starts one agent per node and the ranks talk gloo across them.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from tests.helpers.job_scope import job_agents, job_command_lines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "local-slurm")
RANKS = os.path.join(ROOT, "tests", "scripts", "ranks.py")
STATE = os.environ.get("DSL_SLURM_DIR", "/run/dslaunch-slurm")
CONF = os.path.join(STATE, "slurm.conf")
BINARIES = ("slurmctld", "slurmd", "srun", "salloc", "sbatch", "sinfo", "munged")

pytestmark = pytest.mark.cluster


def _slurm_env() -> dict:
    return {**os.environ, "SLURM_CONF": CONF, "PATH": os.environ.get("PATH", "") + ":/usr/sbin"}


@pytest.fixture(scope="module")
def slurm(cluster):
    """A running local Slurm on the test cluster; one this module started is stopped after it."""
    env = _slurm_env()
    missing = [b for b in BINARIES if not shutil.which(b, path=env["PATH"])]
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}): "
                    "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge")
    was_up = subprocess.run([SCRIPT, "status"], capture_output=True, env=env, timeout=30).returncode == 0
    out = subprocess.run([SCRIPT, "up"], capture_output=True, text=True, env=env, timeout=90)
    if out.returncode != 0:
        pytest.skip(f"scripts/local-slurm up failed: {(out.stderr or out.stdout).strip()[-500:]}")
    yield env
    if not was_up and not os.environ.get("DSL_SLURM_KEEP"):
        subprocess.run([SCRIPT, "down"], capture_output=True, env=env, timeout=60)


def in_allocation(env, alloc_args, *dslaunch_args, timeout=120):
    """salloc ALLOC_ARGS dslaunch --launcher slurm DSLAUNCH_ARGS (run from the root namespace)."""
    argv = ["salloc", "--quiet", "--immediate=30", "--time=5", *alloc_args,
            sys.executable, "-m", "launcher", "--launcher", "slurm", *dslaunch_args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def ranks_alive(marker):
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if marker in " ".join(proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return found


def test_local_slurm_runs_one_slurmd_per_node(slurm):
    done = subprocess.run(["srun", "--immediate=30", "-N2", "hostname"], capture_output=True,
                          text=True, env=slurm, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["node1", "node2"]


def test_gloo_all_reduce_across_slurm_nodes(slurm):
    done = in_allocation(slurm, ["-N2", "--ntasks-per-node=2"], "--no-preflight", "examples/hello_dist.py")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "all_reduce sum = 10 (expected 10)" in line]
    assert len(lines) == 4, done.stdout
    assert {line.split(" on ")[1].split(":")[0] for line in lines} == {"node1", "node2"}


def test_ranks_follow_the_allocation_order_and_slots(slurm):
    done = in_allocation(slurm, ["-w", "node[2-3]", "--ntasks-per-node=2"], "--no-preflight", RANKS, "echo-args")
    assert done.returncode == 0, done.stdout + done.stderr
    envs = sorted((json.loads(line.split("ENV ", 1)[1]) for line in done.stdout.splitlines()
                   if "ENV " in line), key=lambda e: int(e["RANK"]))
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"]) for e in envs] == [
        ("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["MASTER_ADDR"] for e in envs} == {"10.213.0.2"}  # the allocation's first node


def test_crash_on_node2_stops_node1_and_sets_the_exit_code(slurm, tmp_path):
    marker = f"dsl-slurm-{uuid.uuid4().hex[:8]}"
    started = tmp_path / marker   # rank 3 fails once all 4 ranks started; its name marks the job's processes
    started.mkdir()
    done = in_allocation(slurm, ["-N2", "--ntasks-per-node=2"], "--no-preflight", RANKS, "fail", "3", "7",
                         str(started), timeout=240)
    assert done.returncode == 7, done.stdout + done.stderr
    assert re.search(r"rank 3 on node2 exited with code 7", done.stderr), done.stderr
    assert "slept 60 s unstopped" not in done.stdout   # the other ranks were stopped, not left to finish
    # a limit for "never" (the ranks would sleep 60 s by themselves), not a speed bound
    deadline = time.monotonic() + 30
    while ranks_alive(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ranks_alive(marker) == []


def test_sbatch_job_exit_code_is_the_failing_ranks(slurm, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\ncd {ROOT}\nexec {sys.executable} -m launcher --launcher slurm "
                      f"--no-preflight {RANKS} fail 1 5\n")
    script.chmod(0o755)
    log = tmp_path / "job.out"
    done = subprocess.run(["sbatch", "--wait", "--time=5", "-N2", "--ntasks-per-node=2",
                           "-o", str(log), str(script)],
                          capture_output=True, text=True, env=slurm, timeout=120, cwd=str(tmp_path))
    output = log.read_text() if log.exists() else ""
    assert done.returncode == 5, done.stderr + output
    assert "rank 1 on node1 exited with code 5" in output, output


def test_slurm_launch_needs_no_sshd_on_the_nodes(slurm, cluster):
    with cluster.broken(2, "stop"):
        done = in_allocation(slurm, ["-N2", "--ntasks-per-node=1"], RANKS, "echo-args")
    assert done.returncode == 0, done.stdout + done.stderr


def test_successful_job_ends_without_srun_cancelling_the_step(slurm):
    done = in_allocation(slurm, ["-N2", "--ntasks-per-node=1"], "--no-preflight", RANKS, "echo-args")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "forcing job termination" not in done.stderr and "CANCELLED" not in done.stderr, done.stderr


def test_uneven_tasks_per_node_give_that_many_ranks(slurm):
    done = in_allocation(slurm, ["-N2", "-n3"], "--no-preflight", RANKS, "echo-args")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ENV ") == 3


def test_the_agents_check_their_nodes_under_slurm_too(slurm, cluster, tmp_path):
    """Slurm's nodes need not accept ssh; the agents' own checks still stop a doomed job."""
    marker = "slurm-preflight-" + uuid.uuid4().hex[:8]
    with cluster.port_taken(1, 29531):
        done = in_allocation(slurm, ["-w", "node[1-2]", "--ntasks-per-node=2"], "--master_port", "29531",
                             RANKS, "echo-args", marker)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "port 29531 is taken on node1" in done.stderr
    assert marker not in done.stdout  # no rank ran


def test_the_agents_key_is_on_no_command_line_under_slurm(slurm):
    """srun carries $DSLAUNCH_AGENT_SECRET in the tasks' environment; no process shows it (issue 18)."""
    argv = ["salloc", "--quiet", "--immediate=30", "--time=5", "-N2", "--ntasks-per-node=1",
            sys.executable, "-m", "launcher", "--launcher", "slurm", "--no-preflight", RANKS, "nap", "5"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=slurm)
    try:
        rank_pids, end = [], time.time() + 60
        while len(rank_pids) < 2 and time.time() < end:
            match = re.search(r"\] pid (\d+) rank", proc.stdout.readline())
            if match:
                rank_pids.append(int(match.group(1)))
        lines = job_command_lines(proc.pid)   # salloc's tree and the nodes: not another job's
        agents = list(job_agents(proc.pid, lines))
        keys = {_environ(pid).get("DSLAUNCH_AGENT_SECRET") for pid in agents}
        assert len(agents) == 2 and len(keys) == 1 and None not in keys, (agents, keys)
        key = keys.pop()
        assert [cmd for cmd in lines.values() if key in " ".join(cmd)] == []
        assert all("DSLAUNCH_AGENT_SECRET" not in _environ(pid) for pid in rank_pids)
    finally:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert out.count("rested") == 2, out


def _environ(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        items = handle.read().decode("utf-8", "replace").split("\0")
    return dict(item.split("=", 1) for item in items if "=" in item)

#!/usr/bin/env python3
"""Launch and teardown cost against node count on the local test cluster (1 slot per node).

Per size (8, 32, 64, 128 nodes) and runner (ssh, pdsh, openmpi; DeepSpeed's `deepspeed
--launcher pdsh` where it is installed), two jobs:
  ok:   every rank prints one line and exits 0. Measured: time from the launch to the first
        rank started, to all ranks started, to the launcher's exit; the controller's peak RSS
        and CPU seconds (its own process, polled; ssh/pdsh children not counted).
  fail: every rank sleeps; once all have started the last rank exits 1. Measured: time from
        that exit until every rank process on every node is gone (nodes share the PID space
        and the filesystem with this machine, so rank pids are checked from here).
Both jobs also report job_cpu_s: the CPU seconds of every process of the job, on every node
and here (each node's sshd collects its finished sessions' CPU time, agents and ranks included;
this process collects the launcher's, ssh and pdsh included), and load1, the machine's 1-minute
load average at the start (the dev machine is shared).
Needs `scripts/local-cluster up N` for the largest N (run under flock /tmp/dslaunch-cluster.lock).
One JSON line per (size, runner, job) on stdout.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = """import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
work, mode = [a for a in sys.argv[1:] if not a.startswith("--local_rank")][:2]   # deepspeed adds --local_rank
with open(os.path.join(work, f"start.{rank}"), "w") as f:
    f.write(f"{time.time()!r} {os.getpid()}")
print(f"rank {rank} of {world} on {socket.gethostname()}", flush=True)
if mode == "fail":
    if rank == world - 1:
        deadline = time.time() + 120
        while len([n for n in os.listdir(work) if n.startswith("start.")]) < world and time.time() < deadline:
            time.sleep(0.02)
        with open(os.path.join(work, "failed_at"), "w") as f:
            f.write(repr(time.time()))
        sys.exit(1)
    time.sleep(300)
"""


def launcher_argv(runner: str, hosts: str) -> list[str]:
    if runner == "deepspeed":
        return [shutil.which("deepspeed") or "deepspeed", "--hostfile", hosts, "--launcher", "pdsh"]
    return [sys.executable, "-m", "launcher", "-H", hosts, "--launcher", runner, "--no-preflight", "--no_local_rank"]


def starts(work: str) -> list[tuple[float, int]]:
    out = []
    for name in glob.glob(os.path.join(work, "start.*")):
        with open(name) as handle:
            t, pid = handle.read().split()
        out.append((float(t), int(pid)))
    return out


def job_cpu_seconds(size: int) -> float:
    """CPU seconds of finished processes under the nodes' sshd listeners, plus this process's children.

    A process's CPU time goes to its parent when the parent reaps it: ranks to their agent, the
    agent to its sshd session, the session to the node's listening sshd (read from its pid file)."""
    state = os.environ.get("DSL_CLUSTER_DIR", "/run/dslaunch-cluster")
    total = 0.0
    for k in range(1, size + 1):
        try:
            with open(os.path.join(state, f"n{k}", "sshd.pid")) as handle:
                times = psutil.Process(int(handle.read())).cpu_times()
            total += times.children_user + times.children_system
        except (OSError, ValueError, psutil.Error):
            continue
    here = os.times()
    return total + here.children_user + here.children_system


def with_job_cpu(measure, argv: list[str], work: str, world: int) -> dict:
    before, load1 = job_cpu_seconds(world), os.getloadavg()[0]
    row = measure(argv, work, world)
    time.sleep(0.5)   # the node sessions end (and are reaped) just after the launcher
    return {**row, "job_cpu_s": round(job_cpu_seconds(world) - before, 2), "load1": round(load1, 2)}


def run_ok(argv: list[str], work: str, world: int) -> dict:
    t0 = time.time()
    proc = psutil.Popen(argv + [os.path.join(work, "job.py"), work, "ok"], cwd=ROOT,
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak, cpu = 0, 0.0
    while proc.poll() is None:
        try:
            peak = max(peak, proc.memory_info().rss)
            times = proc.cpu_times()
            cpu = times.user + times.system
        except psutil.Error:
            pass
        if time.time() - t0 > 300:
            proc.kill()
        time.sleep(0.02)
    ended = time.time()
    err = proc.stderr.read().decode(errors="replace")
    seen = sorted(t for t, _ in starts(work))
    row = {"exit": proc.returncode, "ranks_started": len(seen), "to_exit_s": round(ended - t0, 3),
           "peak_rss_mib": round(peak / 2**20, 1), "cpu_s": round(cpu, 2)}
    if seen:
        row.update(first_rank_s=round(seen[0] - t0, 3), all_ranks_s=round(seen[-1] - t0, 3))
    if proc.returncode or len(seen) != world:
        row["stderr_tail"] = err[-400:]
    return row


def run_fail(argv: list[str], work: str, world: int) -> dict:
    proc = subprocess.Popen(argv + [os.path.join(work, "job.py"), work, "fail"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stamp = os.path.join(work, "failed_at")
    deadline = time.time() + 300
    while not os.path.exists(stamp) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    if not os.path.exists(stamp):
        proc.kill()
        return {"error": "the job did not reach its failure", "stderr_tail": proc.stderr.read().decode()[-400:]}
    time.sleep(0.005)
    with open(stamp) as handle:
        failed = float(handle.read())
    pids = [pid for _, pid in starts(work)]
    while time.time() < failed + 60:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            break
        time.sleep(0.005)
    gone = time.time()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
    left = [p for p in pids if _alive(p)]
    for p in left:
        try:
            os.kill(p, 9)
        except OSError:
            pass
    return {"exit": proc.returncode, "failure_to_all_stopped_s": round(gone - failed, 3),
            "left_running_after_60s": len(left), "ranks": len(pids)}


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,32,64,128")
    parser.add_argument("--runners", default="ssh,pdsh,openmpi,deepspeed")
    parser.add_argument("--jobs", default="ok,fail")
    args = parser.parse_args()
    runners = [r for r in args.runners.split(",") if r != "deepspeed" or shutil.which("deepspeed")]
    for size in map(int, args.sizes.split(",")):
        for runner in runners:
            for job in args.jobs.split(","):
                work = tempfile.mkdtemp(prefix="bench-scale-", dir=ROOT)
                try:
                    with open(os.path.join(work, "job.py"), "w") as handle:
                        handle.write(JOB)
                    hosts = os.path.join(work, "hosts")
                    with open(hosts, "w") as handle:
                        handle.writelines(f"node{k} slots=1\n" for k in range(1, size + 1))
                    argv = launcher_argv(runner, hosts)
                    row = with_job_cpu(run_ok if job == "ok" else run_fail, argv, work, size)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                print(json.dumps({"nodes": size, "runner": runner, "job": job, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

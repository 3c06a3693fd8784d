#!/usr/bin/env python3
"""Time from a rank's crash to the end of dslaunch, and what is left running after.

A job whose last rank exits 1 after the others are up; every other rank sleeps. The
crashing rank writes the wall-clock time of its exit; the time to dslaunch's end is
measured against it. Locally always; on the test cluster (2 nodes x 2 ranks, the crash
on node 2) when `scripts/local-cluster up 2` has run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = """import os, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print("pid", os.getpid(), flush=True)
if rank == world - 1:
    time.sleep(1.5)
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
    sys.exit(1)
time.sleep(120)
"""


def one(launch: list[str], work: str) -> dict:
    stamp = os.path.join(work, "crashed_at")
    if os.path.exists(stamp):
        os.remove(stamp)
    done = subprocess.run(launch + [os.path.join(work, "job.py"), stamp],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    ended = time.time()
    pids = [int(line.split()[-1]) for line in done.stdout.splitlines() if " pid " in line]
    time.sleep(0.2)
    left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    if not os.path.exists(stamp):
        return {"error": f"the job did not reach its crash (exit {done.returncode}): {done.stderr[-300:]}"}
    with open(stamp) as handle:
        crashed = float(handle.read())
    return {"crash_to_end_s": ended - crashed, "exit": done.returncode, "left_running": len(left)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-teardown-", dir=ROOT)
    with open(os.path.join(work, "job.py"), "w") as handle:
        handle.write(JOB)
    variants = {"local 4 ranks": [sys.executable, "-m", "launcher", "--num_gpus", "4", "--no_local_rank"]}
    if os.path.isfile("/run/dslaunch-cluster/hostfile"):
        hosts = os.path.join(work, "hosts")
        with open(hosts, "w") as handle:
            handle.write("node1 slots=2\nnode2 slots=2\n")
        for runner in ("ssh", "pdsh"):
            variants[f"{runner} 2x2"] = [sys.executable, "-m", "launcher", "-H", hosts, "--launcher", runner,
                                         "--no-preflight", "--no_local_rank"]
    try:
        for name, launch in variants.items():
            report(name, [one(launch, work) for _ in range(args.runs)])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def report(name: str, runs: list[dict]) -> None:
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        print(json.dumps({"variant": name, "error": errors[0]}), flush=True)
        return
    times = [r["crash_to_end_s"] for r in runs]
    print(json.dumps({"variant": name, "median_s": round(statistics.median(times), 3),
                      "max_s": round(max(times), 3), "exit_codes": sorted({r["exit"] for r in runs}),
                      "left_running": sum(r["left_running"] for r in runs)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())

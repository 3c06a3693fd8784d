#!/usr/bin/env python3
"""Time from launch to the end of a 2 nodes x 2 ranks job that only prints.

Side by side in one run (this machine is shared and noisy): dslaunch with each runner,
with and without the pre-launch preflight, and DeepSpeed's `deepspeed` launcher when it
is installed. Prints one JSON line per variant and the ratios. Needs the local cluster:
    scripts/local-cluster up 2 && python scripts/bench_launch.py
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRINT_ONLY = "import os\nprint('rank', os.environ.get('RANK'), flush=True)\n"


def time_runs(argv: list[str], runs: int, cwd: str, env: dict) -> dict:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        times.append(time.perf_counter() - began)
        if done.returncode != 0:
            return {"error": f"exit {done.returncode}: {(done.stderr or done.stdout)[-400:]}"}
        if done.stdout.count("rank") + done.stderr.count("rank") < 4:
            return {"error": "fewer than 4 ranks printed"}
    return {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3), "runs": runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--hosts", default="node1,node2", help="two hosts of the test cluster")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-launch-", dir=ROOT)  # shared filesystem: same path on nodes
    try:
        script = os.path.join(work, "print_rank.py")
        with open(script, "w") as handle:
            handle.write(PRINT_ONLY)
        hostfile = os.path.join(work, "hosts")
        with open(hostfile, "w") as handle:
            handle.write("".join(f"{h} slots=2\n" for h in args.hosts.split(",")))
        env = {**os.environ, "PYTHONPATH": ROOT}
        dslaunch = [sys.executable, "-m", "launcher", "--hostfile", hostfile]
        variants = {
            "dslaunch pdsh": dslaunch + ["--launcher", "pdsh", script],
            "dslaunch pdsh --no-preflight": dslaunch + ["--launcher", "pdsh", "--no-preflight", script],
            "dslaunch ssh --no-preflight": dslaunch + ["--launcher", "ssh", "--no-preflight", script],
            "dslaunch openmpi --no-preflight": dslaunch + ["--launcher", "openmpi", "--no-preflight", script],
        }
        deepspeed = shutil.which("deepspeed")
        if deepspeed:
            variants["deepspeed pdsh"] = [deepspeed, "--hostfile", hostfile, "--launcher", "pdsh",
                                          "--no_local_rank", script]
        results = {}
        for name, argv in variants.items():
            results[name] = time_runs(argv, args.runs, work, env)
            print(json.dumps({"variant": name, **results[name]}), flush=True)
        if not deepspeed:
            print(json.dumps({"variant": "deepspeed pdsh", "error": "deepspeed is not installed "
                              "(pip install deepspeed==0.19.8 to compare)"}))
        base = results.get("deepspeed pdsh", {}).get("median_s")
        if base:
            for name, result in results.items():
                if "median_s" in result and name != "deepspeed pdsh":
                    print(json.dumps({"ratio_to_deepspeed": name, "x": round(result["median_s"] / base, 3)}))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

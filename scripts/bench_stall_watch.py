#!/usr/bin/env python3
"""What --stall_timeout costs dslaunch: the job-wide watch (launcher/control/stalls.py) fed as
the agents feed it, at N nodes x R ranks, in CPU time (time.process_time, so a loaded machine
inflates it less than wall time would).

Each simulated second every node sends one progress message with its R ranks moved by 3 events
(a forward, a backward and a step: the most an agent sends is one a second), and dslaunch checks
twice (CHECK_SECONDS). A third of the way in, the last rank stops; the others go 2 events further
(into the all-reduce) and wait there, sending nothing more. The figures: CPU time per message and
per check while the job moves, per check once it is blocked (every rank is then looked at), the
share of one core the watch needs while it moves, and when the stopped rank is named.

    python scripts/bench_stall_watch.py [--nodes 128 1024] [--ranks 8] [--seconds 60]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launcher.control.stalls import CHECK_SECONDS, JobStalls   # noqa: E402


def measure(nodes: int, ranks: int, seconds: int, timeout: float) -> dict:
    layout = {node: (f"node{node + 1}", tuple(range(node * ranks, (node + 1) * ranks))) for node in range(nodes)}
    stalls = JobStalls(timeout, layout)
    stuck_rank, stop_at = nodes * ranks - 1, seconds // 3
    cpu = {"message": 0.0, "moving": 0.0, "blocked": 0.0}
    count = {"message": 0, "moving": 0, "blocked": 0}
    named = None
    for second in range(seconds):
        moving = second < stop_at
        for node, (_host, node_ranks) in layout.items():
            readings = [[rank, _events(rank == stuck_rank, second, stop_at), second] for rank in node_ranks]
            if not moving and second > stop_at:
                continue   # nothing changed: an agent sends nothing
            began = time.process_time()
            stalls.report(node, readings, float(second) + node / nodes)
            cpu["message"] += time.process_time() - began
            count["message"] += 1
        for half in (0.0, CHECK_SECONDS):
            now = float(second) + 0.999 + half
            if named is not None:
                break
            began = time.process_time()
            found = stalls.check(now)
            phase = "moving" if moving else "blocked"
            cpu[phase] += time.process_time() - began
            count[phase] += 1
            if found is not None:
                named = (found.stall.rank, round(now - stop_at, 1))
    per = {key: cpu[key] / max(count[key], 1) for key in cpu}
    return {"nodes": nodes, "ranks": nodes * ranks, "us_per_message": per["message"] * 1e6,
            "ms_per_check": per["moving"] * 1e3, "ms_per_blocked_check": per["blocked"] * 1e3,
            "core_share": per["message"] * nodes + per["moving"] / CHECK_SECONDS, "named": named}


def _events(stuck: bool, second: int, stop_at: int) -> int:
    """3 events a second; from `stop_at` on, the stuck rank stays and the others go 2 further and wait."""
    if second < stop_at:
        return 3 * (second + 1)
    return 3 * stop_at + (0 if stuck else 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--ranks", type=int, default=8, help="ranks a node")
    parser.add_argument("--seconds", type=int, default=60, help="simulated seconds")
    parser.add_argument("--timeout", type=float, default=10.0, help="--stall_timeout")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} (cores: {os.cpu_count()})")
    print("| nodes | ranks | CPU per progress message | CPU per check, moving | share of one core, moving "
          "| CPU per check, blocked | stopped rank named |")
    print("|---|---|---|---|---|---|---|")
    for nodes in args.nodes:
        row = measure(nodes, args.ranks, args.seconds, args.timeout)
        named = f"rank {row['named'][0]} after {row['named'][1]} s" if row["named"] else "NOT NAMED"
        print(f"| {row['nodes']} | {row['ranks']} | {row['us_per_message']:.1f} us | {row['ms_per_check']:.2f} ms "
              f"| {100 * row['core_share']:.1f} % | {row['ms_per_blocked_check']:.2f} ms | {named} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run a script as a tiny local world: one subprocess per rank with the launcher's env variables.

``run_world(script, world_size, *args)`` returns one RankResult per rank (exit code, stdout,
stderr). Rank processes get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1
and a free MASTER_PORT, and run with this repository first on PYTHONPATH.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str

    def records(self) -> list[dict]:
        """Lines of stdout that start with ``RESULT `` parsed as JSON."""
        return [json.loads(line[7:]) for line in self.stdout.splitlines() if line.startswith("RESULT ")]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_world(script, world_size: int, *args: str, timeout: float = 120, env: dict | None = None) -> list[RankResult]:
    """Start ``world_size`` ranks of ``python script args...`` and wait for all of them."""
    port = free_port()
    processes = []
    for rank in range(world_size):
        rank_env = dict(os.environ)
        rank_env.update(env or {})
        rank_env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                         "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                         "PYTHONPATH": os.pathsep.join([str(REPO), rank_env.get("PYTHONPATH", "")])})
        processes.append(subprocess.Popen([sys.executable, str(script), *args], env=rank_env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for rank, process in enumerate(processes):
            out, err = process.communicate(timeout=timeout)
            results.append(RankResult(rank, process.returncode, out, err))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return results


def check(results: list[RankResult]) -> list[RankResult]:
    """Raise AssertionError with every rank's stderr if any rank failed."""
    failed = [r for r in results if r.returncode != 0]
    if failed:
        details = "\n".join(f"--- rank {r.rank} (exit {r.returncode})\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}" for r in failed)
        raise AssertionError(f"{len(failed)} rank(s) failed:\n{details}")
    return results

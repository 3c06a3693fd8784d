"""Run a script as a tiny local world through the real launcher (`dslaunch --num_gpus N`).

``run_world(script, world_size, *args)`` returns one RankResult per rank (exit code, stdout,
stderr). Ranks get dslaunch's env (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free
MASTER_PORT, ...) and run with this repository first on PYTHONPATH.
"""
from __future__ import annotations

import json
import os
import re
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


def run_world(script, world_size: int, *args: str, timeout: float = 120, env: dict | None = None,
              launcher_args: tuple = ("--no_local_rank",)) -> list[RankResult]:
    """Start ``world_size`` ranks of ``python script args...`` through the real launcher.

    dslaunch streams each rank's lines as ``[rank R] ...``; they are split back per rank.
    A failed job gives every rank dslaunch's exit code (the first failure's own code).
    """
    launch_env = dict(os.environ)
    launch_env.update(env or {})
    launch_env["PYTHONPATH"] = os.pathsep.join([str(REPO), launch_env.get("PYTHONPATH", "")])
    launch_env.setdefault("OMP_NUM_THREADS", "1")
    argv = [sys.executable, "-m", "launcher", "--num_gpus", str(world_size), *launcher_args,
            "--master_port", str(free_port()), str(script), *args]
    done = subprocess.run(argv, env=launch_env, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))
    outs = _split(done.stdout, world_size)
    errs = _split(done.stderr, world_size)
    launcher_lines = [line for line in done.stderr.splitlines() if line.startswith("dslaunch:")]
    for rank in range(world_size):
        errs[rank] += "".join(line + "\n" for line in launcher_lines)
    return [RankResult(rank, done.returncode, outs[rank], errs[rank]) for rank in range(world_size)]


def _split(text: str, world_size: int) -> list[str]:
    per_rank = [""] * world_size
    for line in text.splitlines():
        match = _PREFIX.match(line)
        if match and int(match.group(1)) < world_size:
            per_rank[int(match.group(1))] += match.group(2) + "\n"
    return per_rank


_PREFIX = re.compile(r"^\[rank (\d+)\] (.*)$")


def check(results: list[RankResult]) -> list[RankResult]:
    """Raise AssertionError with every rank's stderr if any rank failed."""
    failed = [r for r in results if r.returncode != 0]
    if failed:
        details = "\n".join(f"--- rank {r.rank} (exit {r.returncode})\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}" for r in failed)
        raise AssertionError(f"{len(failed)} rank(s) failed:\n{details}")
    return results

"""Run dslaunch as a user would and keep every line it printed with when it came (for tests that
check an order of events and report a latency without asserting it)."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_dslaunch(*args: str, timeout: float = 300) -> tuple[int, list]:
    """`python -m launcher ARGS` from the repository, one OpenMP thread a rank; as run_timed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DSLAUNCH_DEBUG", None)
    return run_timed([sys.executable, "-m", "launcher", *args], env=env, cwd=REPO, timeout=timeout)


def run_timed(argv: list[str], env: dict[str, str], cwd: str, timeout: float = 300) -> tuple[int, list]:
    """(return code, [(seconds since start, "out" or "err", line)]); killed after `timeout` s (code then -9)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    started, lines = time.monotonic(), []

    def read(stream, name):
        for line in stream:
            lines.append((time.monotonic() - started, name, line.rstrip("\n")))
    readers = [threading.Thread(target=read, args=(proc.stdout, "out")),
               threading.Thread(target=read, args=(proc.stderr, "err"))]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        proc.kill()
        proc.wait()
        for reader in readers:
            reader.join()
    return proc.returncode, lines


def first(lines: list, text: str, stream: str = "err") -> int:
    """Index of the first line of `stream` that holds `text`."""
    return next(i for i, (_t, name, line) in enumerate(lines) if name == stream and text in line)


def stream_text(lines: list, stream: str = "err") -> str:
    return "\n".join(line for _t, name, line in lines if name == stream)

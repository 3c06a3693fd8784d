"""What dslaunch prints while a job runs: prefixed rank lines and the final summary."""
from __future__ import annotations

import sys
import threading

from launcher.node.process import RankExit, RankOutput
from launcher.planning.redact import Scrubber

_lock = threading.Lock()
_scrub = Scrubber()  # hides secret values in everything printed here (planning/redact.py)


def hide_values(values) -> None:
    """From now on, print these values as `<redacted>` (app.py calls it once per launch)."""
    global _scrub
    _scrub = Scrubber(values)


def scrub(text: str) -> str:
    """`text` with the hidden values replaced (for reports printed outside `say`)."""
    return _scrub(text)


def print_rank_line(event: RankOutput) -> None:
    stream = sys.stdout if event.stream == "stdout" else sys.stderr
    with _lock:
        stream.write(f"[rank {event.rank}] {_scrub(event.line)}\n")
        stream.flush()


def say(message: str) -> None:
    """A launcher message (not a rank's): always on stderr, prefixed `dslaunch:`."""
    with _lock:
        sys.stderr.write(f"dslaunch: {_scrub(message)}\n")
        sys.stderr.flush()


def failure_summary(failure: RankExit, lines: int = 10) -> str:
    text = f"{failure.describe()} (the first failure; every other rank was stopped)"
    tail = [line for line in failure.tail if line.strip()][-lines:]
    if tail:
        text += f"\nlast lines of rank {failure.rank}:\n" + "\n".join(f"    {line}" for line in tail)
    return text

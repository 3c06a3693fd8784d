"""How an engine error that the script does not catch ends a rank: one message, not a traceback per rank.

A bad config is the same on every rank, so every rank would print the same 20-line traceback.
Instead rank 0 prints ``dslaunch: config error: <message>`` and its hint and exits with the
error's code (2); the other ranks wait a moment first, so that the launcher, seeing rank 0 fail,
stops them before they repeat it. A rank whose error is its own (rank 0 did not fail) still
says it after that moment. Under a launcher, a KeyboardInterrupt (Ctrl-C, forwarded as SIGINT)
ends the rank quietly with 130. ``DSLAUNCH_DEBUG=1`` keeps Python's traceback.
"""
from __future__ import annotations

import os
import sys
import time

from launcher.errors import DslaunchError

# long enough for the launcher to stop the other ranks once rank 0 exits (it polls every 20 ms,
# a remote node hears the stop within a heartbeat); short enough for a rank's own error
OTHER_RANKS_WAIT_S = 3.0


def install(rank: int, environ: dict[str, str]) -> None:
    """Make an uncaught DslaunchError end this rank with one message (idempotent)."""
    if environ.get("DSLAUNCH_DEBUG") or getattr(sys.excepthook, "_dslaunch_rank", None) is not None:
        return
    previous = sys.excepthook

    under_launcher = "RANK" in environ

    def hook(kind, error, traceback) -> None:
        if under_launcher and isinstance(error, KeyboardInterrupt):
            os._exit(130)   # Ctrl-C: the launcher says it in one line; no traceback from every rank
        if not isinstance(error, DslaunchError):
            previous(kind, error, traceback)
            return
        if rank != 0:
            time.sleep(OTHER_RANKS_WAIT_S)
        sys.stdout.flush()
        text = f"dslaunch: {error.kind}: {error.message}\n"
        if error.hint:
            text += f"  hint: {error.hint}\n"
        # the real stderr: torch.distributed's own hook calls ours with sys.stderr swapped for a buffer
        stream = sys.__stderr__ or sys.stderr
        stream.write(text)
        stream.flush()
        os._exit(error.exit_code)   # skip interpreter teardown: no second wave of warnings

    hook._dslaunch_rank = rank
    sys.excepthook = hook

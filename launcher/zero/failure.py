"""How an engine error that the script does not catch ends a rank: one message, not a traceback per rank.

A bad config is the same on every rank, so every rank would print the same 20-line traceback.
Instead rank 0 prints ``dslaunch: config error: <message>`` and its hint and exits with the
error's code (2); the other ranks wait a moment first, so that the launcher, seeing rank 0 fail,
stops them before they repeat it. A rank whose error is its own (rank 0 did not fail) still
says it after that moment. Under a launcher, a KeyboardInterrupt (Ctrl-C, forwarded as SIGINT)
ends the rank quietly with 130, and a torch.distributed error caused by a peer that went away
(its store gone, the connection reset or closed) is one line after the same moment: the peer's
own message is the one that explains the job's end. ``DSLAUNCH_DEBUG=1`` keeps Python's traceback.

Installed at every entry point that can fail before a step (``initialize``, ``zero.Init``,
``init_distributed``), so that no entry point leaves a rank without it.
"""
from __future__ import annotations

import os
import sys
import time

from launcher.errors import DslaunchError

# long enough for the launcher to stop the other ranks once rank 0 exits (it polls every 20 ms,
# a remote node hears the stop within a heartbeat); short enough for a rank's own error
OTHER_RANKS_WAIT_S = 3.0


# how torch.distributed (gloo, the TCP store, NCCL) words "the other side is gone"
_PEER_GONE_WORDS = ("connection reset by peer", "connection closed by peer", "broken pipe", "connection refused",
                    "socket closed", "failed to recv", "got 0 bytes", "connection was likely closed",
                    "the remote end closed", "ncclremoteerror")
PEER_GONE_EXIT_CODE = 1


def install_from_env(environ=None) -> None:
    """``install`` with this rank's number read from ``environ`` (default: the process's)."""
    environ = dict(os.environ if environ is None else environ)
    install(_rank_of(environ), environ)


def _rank_of(environ) -> int:
    value = environ.get("RANK", "0")
    return int(value) if value.isdigit() else 0


def is_peer_gone(error: BaseException) -> bool:
    """True for a torch.distributed error whose cause is a peer that exited (store or link gone)."""
    names = {cls.__name__ for cls in type(error).__mro__}
    if not names & {"DistError", "DistNetworkError", "DistStoreError", "RuntimeError", "ConnectionError"}:
        return False
    text = str(error).lower()
    return any(words in text for words in _PEER_GONE_WORDS)


def install(rank: int, environ: dict[str, str]) -> None:
    """Make an uncaught DslaunchError (or a peer's exit) end this rank with one message (idempotent)."""
    if environ.get("DSLAUNCH_DEBUG") or getattr(sys.excepthook, "_dslaunch_rank", None) is not None:
        return
    previous = sys.excepthook

    under_launcher = "RANK" in environ

    def hook(kind, error, traceback) -> None:
        if under_launcher and isinstance(error, KeyboardInterrupt):
            os._exit(130)   # Ctrl-C: the launcher says it in one line; no traceback from every rank
        if under_launcher and not isinstance(error, DslaunchError) and is_peer_gone(error):
            time.sleep(OTHER_RANKS_WAIT_S)   # usually stopped here by the launcher, with the peer's message
            first_line = (str(error).strip().splitlines() or [""])[0][:200]
            _say(f"dslaunch: rank {rank}: a peer went away ({type(error).__name__}: {first_line})\n")
            os._exit(PEER_GONE_EXIT_CODE)
        if not isinstance(error, DslaunchError):
            previous(kind, error, traceback)
            return
        if rank != 0:
            time.sleep(OTHER_RANKS_WAIT_S)
        text = f"dslaunch: {error.kind}: {error.message}\n"
        if error.hint:
            text += f"  hint: {error.hint}\n"
        _say(text)
        os._exit(error.exit_code)   # skip interpreter teardown: no second wave of warnings

    hook._dslaunch_rank = rank
    sys.excepthook = hook


def _say(text: str) -> None:
    sys.stdout.flush()
    # the real stderr: torch.distributed's own hook calls ours with sys.stderr swapped for a buffer
    stream = sys.__stderr__ or sys.stderr
    stream.write(text)
    stream.flush()

"""The stall beat (``--stall_timeout``): a rank's count of forward, backward and step calls in a file its node reads.

The launcher names a file per rank in ``DSLAUNCH_PROGRESS_FILE``; the rank rewrites one line
there, ``"<events> <step>\\n"``, where *events* counts the engine's forward, backward and step
calls (so a rank stuck inside a step is behind peers that went on to wait in its all-reduce)
and *step* is the optimizer step to name in the report. A plain script calls ``beat()``.
The rank's Python stack is not armed here: the launcher arms faulthandler in every Python rank
at start-up (launcher/node/rank_site/sitecustomize.py), before any import, into a file of its
own; registering SIGUSR1 here would take the dump away from that file. Torch-free; a no-op
(one environment read) without the launcher's variable.
"""
from __future__ import annotations

import os

ENV_VARIABLE = "DSLAUNCH_PROGRESS_FILE"
_state = {"fd": None, "events": 0, "opened": False}


def _open() -> int | None:
    _state["opened"] = True
    path = os.environ.get(ENV_VARIABLE)
    if not path:
        return None
    try:
        _state["fd"] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:   # no file system: no progress
        _state["fd"] = None
    return _state["fd"]


def reached(step: int = -1) -> None:
    """One more event (a forward, backward or step call; a script's heartbeat) at optimizer step ``step``."""
    fd = _state["fd"] if _state["opened"] else _open()
    if fd is None:
        return
    _state["events"] += 1
    line = f"{_state['events']} {step}\n".ljust(40).encode()   # fixed width: no stale tail after a rewrite
    try:
        os.pwrite(fd, line, 0)
    except OSError:
        pass


def beat(step: int = -1) -> None:
    """For a plain script (no engine): report progress, e.g. once per training step."""
    reached(step)

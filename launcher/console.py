"""What dslaunch prints while a job runs: prefixed rank lines and the final summary."""
from __future__ import annotations

import re
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
        stream.write(f"[rank {event.rank}] {_scrub(_without_torch_prefix(event))}\n")
        stream.flush()


def print_rank_lines(events: list[RankOutput]) -> None:
    """Many lines at once: one write and one flush per stream, in their order within each."""
    out = [(e.rank, e.line) for e in events if e.stream == "stdout"]
    err = [(e.rank, e.line) for e in events if e.stream != "stdout"]
    write_rank_lines(out, err)


def write_rank_lines(out: list[tuple[int, str]], err: list[tuple[int, str]]) -> None:
    """(rank, line) pairs for stdout and for stderr, each list in one write (the controller's hot path)."""
    texts = [(stream, _rank_text(pairs)) for stream, pairs in ((sys.stdout, out), (sys.stderr, err)) if pairs]
    with _lock:
        for stream, text in texts:
            stream.write(text)
            stream.flush()


def _rank_text(pairs: list[tuple[int, str]]) -> str:
    lines = []
    for rank, line in pairs:
        if line.startswith("[rank"):
            line = _without_torch_prefix(RankOutput(rank, "", line))
        lines.append(f"[rank {rank}] {line}\n")
    return _scrub("".join(lines)) if _scrub.values else "".join(lines)


def _without_torch_prefix(event: RankOutput) -> str:
    """torch.distributed's excepthook prefixes each traceback line with "[rankN]: "; ours says it already."""
    own = f"[rank{event.rank}]:"
    if event.line.startswith(own):
        return event.line[len(own):].removeprefix(" ")
    return event.line


def say(message: str) -> None:
    """A launcher message (not a rank's): always on stderr, prefixed `dslaunch:`."""
    with _lock:
        sys.stderr.write(f"dslaunch: {_scrub(message)}\n")
        sys.stderr.flush()


def failure_summary(failure: RankExit, lines: int = 10, exits: tuple[RankExit, ...] = ()) -> str:
    """What dslaunch says when a rank failed: which, how, its last lines, and a hint that fits.

    ``exits``: every rank's exit when known (a local job), to say "all N ranks failed the same way".
    """
    tail = [line for line in failure.tail if line.strip()]
    engine_error = next((line for line in reversed(tail) if _ENGINE_ERROR.match(line)), None)
    if engine_error is not None:   # the rank already said it in one line (launcher/zero/failure.py)
        kind = _ENGINE_ERROR.match(engine_error).group(1)
        others = _others(failure, exits) or "; every other rank was stopped"
        return f"{failure.describe()}: the engine stopped it on a {kind} (the message is above){others}"
    text = failure.describe()
    raised = raised_exception(tail)
    if raised is not None:   # the cause, in the summary's first line: not only "exited with code 1"
        text += f": {raised}"
        if failure.returncode < 0:
            text += (" (the script raised it; the signal came after, as the process exited with its "
                     "process group still open)")
    if failure.returncode == 2:
        text += " (the script's own exit code 2, not a dslaunch usage error)"
    text += _others(failure, exits) or " (the first failure; every other rank was stopped)"
    if tail:
        text += f"\nlast lines of rank {failure.rank}:\n" + "\n".join(f"    {line}" for line in tail[-lines:])
    hint = _hint(tail)
    if hint:
        text += f"\n  hint: {hint}"
    return text


_ENGINE_ERROR = re.compile(r"^dslaunch: ([a-z ]+ error|not supported): ")
_LOCAL_RANK_REJECTED = re.compile(r"error: unrecognized arguments:.*--local_rank")
_TORCH_PREFIX = re.compile(r"^\[rank\d+\]: ?")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure)\b(:.*)?$")


def raised_exception(tail: list[str]) -> str | None:
    """The exception line of the last Python traceback in a rank's last lines ("ValueError: ..."), or
    None when they hold no traceback (or it was cut before its end)."""
    lines = [_TORCH_PREFIX.sub("", line).rstrip() for line in tail]
    start = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")),
                default=None)
    if start is None:
        return None
    found = [line for line in lines[start + 1:] if _EXCEPTION_LINE.match(line)]
    return found[0][:300] if found else None


def _hint(tail: list[str]) -> str | None:
    if any(_LOCAL_RANK_REJECTED.search(line) for line in tail):
        return ("the script's argparse rejects the --local_rank=N that dslaunch appends (as DeepSpeed does): "
                "pass --no_local_rank to dslaunch (the rank still gets LOCAL_RANK in its environment), "
                "or add parser.add_argument('--local_rank', type=int) to the script")
    return None


def _others(failure: RankExit, exits: tuple[RankExit, ...]) -> str:
    """ " (all N ranks failed the same way)" when every rank ended as the first failure did."""
    if len(exits) < 2:
        return ""
    last = [line for line in failure.tail if line.strip()][-1:]
    same = [e for e in exits if e.returncode == failure.returncode and [line for line in e.tail if line.strip()][-1:] == last]
    if len(same) == len(exits):
        return f" (all {len(exits)} ranks failed the same way)"
    return ""

"""A rank's Python stack, read from faulthandler's dump, and where it stands: in a collective or not.

Pure (text in, records out): the node side (stack_dump.py) takes the dumps, dslaunch or the
local supervisor judges them (hang.py). faulthandler writes each thread as
``Thread 0x... (most recent call first):`` (``Current thread`` for the one that took the signal)
followed by ``  File "path", line N in function`` lines, innermost first; the rank's bootstrap
(rank_site/sitecustomize.py) writes ``dslaunch-stacks pid=N main_thread=0x...`` before any dump.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

HEADER = "dslaunch-stacks"
KEPT_FRAMES = 24     # innermost frames of the main thread sent to dslaunch (enough to reach the script)

_HEADER = re.compile(rf"^{HEADER} pid=(\d+) main_thread=(0x[0-9a-fA-F]+)$")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):$")
_STACK = re.compile(r"^Stack \(most recent call first\):$")   # a dump of one thread (all_threads=False)
_FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')

# where torch.distributed, DeepSpeed and our engine wait for the other ranks (a path's '/'-joined part)
COMM_PATHS = ("/torch/distributed/", "/torch/futures/", "/deepspeed/comm/", "/launcher/zero/distributed/",
              "/launcher/zero/comm.py", "/launcher/zero/pipeline/p2p.py")
COLLECTIVES = frozenset((
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
    "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list",
    "recv_object_list", "wait", "init_process_group", "new_group", "destroy_process_group"))
# an async collective's handle waited on in the script's own line (Work.wait is C: no frame of its own)
_WAIT_CALL = re.compile(r"(?<![\w.])(?!os\.)[\w.\[\]()]*\.wait\(")


@dataclass(frozen=True)
class Frame:
    """One frame of a stack: where (file, line), which function, and the line's source when known."""

    file: str
    line: int
    function: str
    code: str = ""

    def where(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass(frozen=True)
class RankStack:
    """A rank's main thread, innermost frame first; `note` says why there are no frames; `moved`:
    it was not where it was a moment before (stack_dump.sample_stacks takes several dumps): not hung."""

    rank: int
    frames: tuple[Frame, ...] = ()
    note: str = ""
    moved: bool = False

    def to_json(self) -> dict:
        return {"rank": self.rank, "note": self.note, "moved": self.moved,
                "frames": [[f.file, f.line, f.function, f.code] for f in self.frames]}


def stack_from_json(data) -> RankStack | None:
    """An agent's record back; None when it is not one (a garbled message is no traceback)."""
    try:
        frames = tuple(Frame(str(f[0]), int(f[1]), str(f[2]), str(f[3]) if len(f) > 3 else "")
                       for f in data.get("frames", ()))
        return RankStack(int(data["rank"]), frames, str(data.get("note", "")), data.get("moved") is True)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return None


def armed(text: str) -> list[tuple[int, int]]:
    """(pid, main thread id) of every process that armed the dump, in the order they started."""
    found = []
    for line in text.splitlines():
        match = _HEADER.match(line)
        if match:
            found.append((int(match.group(1)), int(match.group(2), 16)))
    return found


def threads(text: str) -> list[tuple[int | None, bool, list[Frame]]]:
    """Every thread of a dump as (thread id, whether it took the signal, frames innermost first)."""
    found: list[tuple[int | None, bool, list[Frame]]] = []
    for line in text.splitlines():
        thread = _THREAD.match(line)
        if thread:
            found.append((int(thread.group(2), 16), thread.group(1) == "Current thread", []))
        elif _STACK.match(line):
            found.append((None, True, []))
        elif found and (frame := _FRAME.match(line)):
            number = frame.group(2)
            found[-1][2].append(Frame(frame.group(1), int(number) if number.isdigit() else 0, frame.group(3)))
    return found


def main_thread(text: str, main_id: int | None) -> list[Frame]:
    """The main thread's frames: the one the bootstrap named, else the oldest (CPython lists it last)."""
    every = threads(text)
    named = [frames for ident, _current, frames in every if main_id is not None and ident == main_id]
    if named:
        return named[-1]
    return every[-1][2] if every else []


@dataclass(frozen=True)
class Place:
    """Where a rank stands: "collective" (waits for the others: `name` says in which), "backward"
    (autograd's engine: DDP and FSDP wait for their gradient all-reduce inside it), "other" (its own
    work: the likely cause of a hang), "unknown" (no stack: `name` says why)."""

    kind: str
    name: str
    caller: Frame | None = None   # where the script called the collective (its innermost frame outside it)


def _in_comm(frame: Frame) -> bool:
    path = frame.file.replace("\\", "/")
    return any(part in path for part in COMM_PATHS)


def place_of(stack: RankStack) -> Place:
    """Classify a rank's main thread by its innermost frames (see Place)."""
    frames = stack.frames
    if not frames:
        return Place("unknown", stack.note or "no Python frame")
    inner = frames[0]
    if _in_comm(inner):
        comm = []
        for frame in frames:
            if not _in_comm(frame):
                break
            comm.append(frame)
        named = next((f.function for f in comm if f.function in COLLECTIVES), comm[-1].function)
        return Place("collective", named, frames[len(comm)] if len(comm) < len(frames) else None)
    path = inner.file.replace("\\", "/")
    if "/torch/cuda/" in path and inner.function == "synchronize":
        return Place("collective", "torch.cuda.synchronize (the GPU's queue, often a collective's kernel)",
                     frames[1] if len(frames) > 1 else None)
    if "/torch/autograd/" in path:
        return Place("backward", "backward", next((f for f in frames if "/torch/" not in f.file), None))
    if _WAIT_CALL.search(inner.code):
        return Place("collective", "wait (an async collective's handle)", inner)
    return Place("other", inner.function)

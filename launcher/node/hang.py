"""``--stall_timeout`` when no rank of the job makes progress: from every rank's stack, one message.

Pure. The ranks whose main thread is not inside a collective (or autograd's backward, where DDP
waits) are the likely cause: the others wait for them. The message names those with their top
frames, and groups the waiting ranks by the collective and the line of the script they wait in.
Used by dslaunch (launcher/control/stalls.py, with the agents' stacks) and by the local supervisor.
"""
from __future__ import annotations

from dataclasses import dataclass

from launcher.node.stacks import Place, RankStack, place_of

SHOWN_FRAMES = 8      # a likely cause's innermost frames in the message
SHOWN_CAUSES = 4      # likely causes shown with their frames (the rest by number)
SHOWN_GROUPS = 8      # groups of waiting ranks shown (the rest counted)


@dataclass(frozen=True)
class Diagnosis:
    """The one message for the job, and the ranks to stop (the likely causes, else the lowest rank)."""

    message: str
    causes: tuple[int, ...]
    stop: tuple[int, ...]


def ranks_text(ranks) -> str:
    """'rank 3', 'ranks 0, 2-5' (runs of consecutive ranks folded)."""
    ranks = sorted(set(ranks))
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def diagnose(stacks: dict[int, RankStack], hosts: dict[int, str], quiet_s: float, timeout_s: float) -> Diagnosis:
    """Judge every rank's stack; `hosts`: rank -> its host (shown when the job spans several)."""
    places = {rank: place_of(stack) for rank, stack in sorted(stacks.items())}
    causes = [rank for rank, place in places.items() if place.kind == "other"]
    unknown = [rank for rank, place in places.items() if place.kind == "unknown"]
    in_backward = [rank for rank, place in places.items() if place.kind == "backward"]
    suspects = causes or unknown or in_backward
    several_hosts = len(set(hosts.values())) > 1
    lines = [f"no rank made progress for {quiet_s:.0f} s (--stall_timeout {timeout_s:g}: no beat() or engine "
             f"step and no line of output from any rank); every rank's Python stack was taken:"]
    lines += _cause_lines(causes, stacks, places, hosts if several_hosts else {})
    lines += [f"  no stack from {ranks_text(ranks)}: {note}" for note, ranks in _grouped(unknown, places).items()]
    lines += _waiting_lines(places)
    lines.append(_verdict(causes, unknown, in_backward, places))
    stop = tuple(suspects) if suspects else tuple(sorted(places)[:1])
    if stop:
        lines.append(f"  stopping {ranks_text(stop)}: the job ends with 137, or restarts under --max_restarts")
    return Diagnosis("\n".join(lines), tuple(causes), stop)


def _cause_lines(causes: list[int], stacks: dict[int, RankStack], places: dict[int, Place],
                 hosts: dict[int, str]) -> list[str]:
    lines = []
    for rank in causes[:SHOWN_CAUSES]:
        where = f"rank {rank}" + (f" on {hosts[rank]}" if rank in hosts else "")
        lines.append(f"  likely cause: {where} is not in a collective, in {places[rank].name} "
                     f"(main thread, most recent call first):")
        frames = stacks[rank].frames
        for frame in frames[:SHOWN_FRAMES]:
            lines.append(f"      {frame.where()}" + (f": {frame.code}" if frame.code else ""))
        if len(frames) > SHOWN_FRAMES:
            lines.append(f"      ... {len(frames) - SHOWN_FRAMES} more frames")
    if len(causes) > SHOWN_CAUSES:
        lines.append(f"  also not in a collective: {ranks_text(causes[SHOWN_CAUSES:])}")
    return lines


def _waiting_lines(places: dict[int, Place]) -> list[str]:
    """'  waiting in all_reduce: ranks 0, 2 (called at train.py:31 in step)', one line per collective and line."""
    groups: dict[tuple[str, str], list[int]] = {}
    for rank, place in places.items():
        if place.kind in ("collective", "backward"):
            called = f" (called at {place.caller.where()})" if place.caller is not None else ""
            groups.setdefault((place.name, called), []).append(rank)
    ordered = sorted(groups.items(), key=lambda item: item[1][0])
    lines = [f"  waiting in {name}: {ranks_text(ranks)}{called}" for (name, called), ranks in ordered[:SHOWN_GROUPS]]
    if len(ordered) > SHOWN_GROUPS:
        rest = [rank for _key, ranks in ordered[SHOWN_GROUPS:] for rank in ranks]
        lines.append(f"  waiting elsewhere: {ranks_text(rest)}")
    return lines


def _verdict(causes: list[int], unknown: list[int], in_backward: list[int], places: dict[int, Place]) -> str:
    if causes and len(causes) == len(places):
        return ("  no rank waits in a collective: every rank is in its own work (stuck outside "
                "torch.distributed alike, e.g. on one hung file system, or a long silent stretch)")
    if causes:
        return f"  the other ranks wait for {ranks_text(causes)}"
    if unknown:
        return f"  no rank is seen outside a collective; {ranks_text(unknown)} gave no stack and may be the cause"
    if in_backward:
        return (f"  no rank is outside a collective or backward; {ranks_text(in_backward)} in backward: a DDP "
                f"or FSDP all-reduce there waits for a rank that did not reach it, or a long backward")
    if not places:
        return "  no rank was running to be judged"
    calls = {(place.name, place.caller.where() if place.caller else "") for place in places.values()}
    if len(calls) > 1:
        return ("  every rank waits in a collective, not all in the same call: the ranks call collectives "
                "in different orders (a collective inside a branch that only some ranks take)")
    return ("  every rank waits in the same collective: a peer this job does not see (a lost rank of "
            "another group), or the network between the ranks")


def _grouped(ranks: list[int], places: dict[int, Place]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for rank in ranks:
        found.setdefault(places[rank].name, []).append(rank)
    return found

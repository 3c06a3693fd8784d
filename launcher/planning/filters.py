"""Resource filters: which slots of which hosts a job uses. Pure.

`--include/--exclude` take DeepSpeed's `host[:slot,slot][@host...]` syntax. Results match
DeepSpeed 0.19.8 (not the upstream regression that seeds from the include string):
specs for one host merge, deduplicate and sort; hosts keep hostfile order; a host
left with no slots is dropped.
"""
from __future__ import annotations

from launcher.errors import FilterError
from launcher.planning.hostfile import show, whole_number

Resources = dict[str, list[int]]  # host name -> slot ids, in node order


def parse_node_specs(spec: str, option: str) -> dict[str, list[int] | None]:
    """`w0:1@w0:0,1@w1` -> {'w0': [0, 1], 'w1': None}; None means the whole host."""
    result: dict[str, list[int] | None] = {}
    for part in spec.split("@"):
        part = part.strip()
        if not part:
            raise FilterError(f"{option} '{show(spec)}': empty node spec", hint="join specs with '@': 'w0:0,1@w1'")
        name, sep, slot_text = part.partition(":")
        if not name or ":" in slot_text:
            raise FilterError(f"{option} '{show(spec)}': bad node spec '{show(part)}'", hint="write HOST or HOST:0,2")
        if not sep:
            result[name] = None
            continue
        slots = []
        for item in slot_text.split(","):
            slot = whole_number(item.strip())
            if slot is None:
                raise FilterError(f"{option} '{show(spec)}': slot '{show(item)}' of host '{show(name)}' is not a "
                                  "whole number", hint="slots are GPU ids: HOST:0,1,2")
            slots.append(slot)
        previous = result.get(name, [])
        if name in result and previous is None:
            continue  # the whole host was already asked for
        result[name] = sorted(set(previous or []) | set(slots))
    return result


def apply_include_exclude(pool: Resources, include: str | None, exclude: str | None,
                          from_hostfile: bool = True) -> Resources:
    """Narrow `pool` by --include or --exclude (mutually exclusive); `from_hostfile`: where `pool` came from."""
    if include and exclude:
        raise FilterError("--include and --exclude are mutually exclusive", hint="use one of them")
    if not include and not exclude:
        return {host: list(slots) for host, slots in pool.items()}
    option = "--include" if include else "--exclude"
    specs = parse_node_specs(include or exclude, option)
    for name, slots in specs.items():
        if name not in pool:
            if from_hostfile:
                raise FilterError(f"{option}: host '{show(name)}' is not in the hostfile", hint="hosts: " + ", ".join(pool))
            raise FilterError(f"{option}: host '{show(name)}' is unknown: without a hostfile only this machine "
                              f"({', '.join(pool)}) is used", hint="name the hosts in a hostfile and pass -H HOSTFILE")
        for slot in slots or []:
            if slot not in pool[name]:
                raise FilterError(f"{option}: host '{name}' has no slot {slot}",
                                  hint=f"'{name}' has slots {_ranges(pool[name])}")
    result: Resources = {}
    for name, available in pool.items():
        if include:
            chosen = available if specs.get(name, 0) is None else (specs.get(name) or [])
        else:
            removed = set(available if specs.get(name, 0) is None else (specs.get(name) or []))
            chosen = [s for s in available if s not in removed]
        if chosen:
            result[name] = list(chosen)
    if not result:
        raise FilterError(f"{option} leaves no slots to run on", hint="keep at least one host or slot")
    return result


def apply_counts(pool: Resources, num_nodes: int | None, num_gpus: int | None) -> Resources:
    """Keep the first `num_nodes` nodes and the first `num_gpus` slots of each."""
    result = {host: list(slots) for host, slots in pool.items()}
    if num_nodes is not None:
        if num_nodes < 1:
            raise FilterError(f"--num_nodes must be >= 1, got {num_nodes}")
        if num_nodes > len(result):
            raise FilterError(f"--num_nodes {num_nodes} asks for more nodes than the {len(result)} available",
                              hint="available: " + ", ".join(result))
        result = dict(list(result.items())[:num_nodes])
    if num_gpus is not None:
        if num_gpus < 1:
            raise FilterError(f"--num_gpus must be >= 1, got {num_gpus}")
        short = [f"{h} ({len(s)})" for h, s in result.items() if len(s) < num_gpus]
        if short:
            raise FilterError(f"--num_gpus {num_gpus} asks for more slots than some hosts have: {', '.join(short)}",
                              hint="lower --num_gpus or fix slots= in the hostfile")
        result = {host: slots[:num_gpus] for host, slots in result.items()}
    return result


def _ranges(slots: list[int]) -> str:
    return ",".join(str(s) for s in slots)

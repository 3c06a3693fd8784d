"""The FLOPs profile as text: a summary, the top modules per depth, and (``detailed``) the module tree."""
from __future__ import annotations

from dataclasses import dataclass

from launcher.zero.flops.counter import FlopCount


@dataclass(frozen=True)
class StepFacts:
    """What the profiled step was, besides its FLOPs (latencies in seconds; None: not measured)."""

    step: int
    params: int
    world_size: int = 1
    micro_batch: int | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    step_s: float | None = None


def si(value: float, unit: str = "") -> str:
    """1.23 G, 45.6 M ...: the profile's numbers, three significant figures."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:g} {unit}".rstrip()


def seconds(value: float) -> str:
    return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.2f} s"


def profile_text(count: FlopCount, facts: StepFacts, module_depth: int = -1, top_modules: int = 1,
                 detailed: bool = True, module_types: dict[str, str] | None = None) -> str:
    """The whole report; ``module_types``: dotted name -> class name in ``named_modules`` order, for the tree."""
    lines = [f"---- FLOPs profile of step {facts.step} (rank 0; torch.utils.flop_counter: matrix products "
             "and attention, 2 FLOPs per multiply-add) ----"]
    row = "{:<44} {}".format
    lines.append(row("parameters:", f"{si(facts.params)} ({facts.params})"))
    if facts.micro_batch is not None:
        lines.append(row("world size / micro batch per rank:", f"{facts.world_size} / {facts.micro_batch}"))
    backward = count.total - count.forward
    lines.append(row("forward FLOPs per rank:", f"{si(count.forward)} ({count.forward})"))
    lines.append(row("backward FLOPs per rank:", f"{si(backward)} ({backward})"))
    lines.append(row("step FLOPs per rank (forward + backward):", f"{si(count.total)} ({count.total})"))
    timed = [t for t in (facts.forward_s, facts.backward_s, facts.step_s) if t is not None]
    for name, value in (("forward", facts.forward_s), ("backward", facts.backward_s), ("optimizer step", facts.step_s)):
        if value is not None:
            lines.append(row(f"{name} latency:", seconds(value)))
    if facts.forward_s and count.forward:
        lines.append(row("forward FLOP/s per rank:", si(count.forward / facts.forward_s, "FLOP/s")))
    if facts.forward_s is not None and facts.backward_s is not None and len(timed) == 3:
        total_s = sum(timed)
        lines.append(row("step latency (forward + backward + step):", seconds(total_s)))
        lines.append(row("achieved FLOP/s per rank (step FLOPs / latency):", si(count.total / total_s, "FLOP/s")))
    lines.extend(_top_modules(count, module_depth, top_modules))
    if detailed:
        lines.extend(_tree(count, module_depth, module_types or {}))
    lines.append("-" * 40)
    return "\n".join(lines)


def _depth(name: str) -> int:
    return 0 if name == "" else name.count(".") + 1


def _top_modules(count: FlopCount, module_depth: int, top_modules: int) -> list[str]:
    named = {n: f for n, f in count.per_module.items() if n}
    if not named:
        return []
    deepest = max(_depth(n) for n in named)
    last = deepest if module_depth < 0 else min(module_depth, deepest)
    lines = [f"top {top_modules} module(s) by FLOPs (forward + backward) at each depth:"]
    for depth in range(1, last + 1):
        here = sorted(((f, n) for n, f in named.items() if _depth(n) == depth), key=lambda t: (-t[0], t[1]))
        shown = ", ".join(f"{n} {si(f)}" for f, n in here[:top_modules])
        lines.append(f"  depth {depth}: {shown}")
    return lines


def _tree(count: FlopCount, module_depth: int, module_types: dict[str, str]) -> list[str]:
    total = count.total or 1
    lines = ["modules with FLOPs, in the model's order (forward + backward, share of the step):"]
    order = [n for n in module_types if n in count.per_module] if module_types else sorted(count.per_module)
    for name in order:
        depth = _depth(name)
        if module_depth >= 0 and depth > module_depth:
            continue
        flops = count.per_module[name]
        kind = module_types.get(name, "")
        label = (name or "(model)") + (f" ({kind})" if kind else "")
        lines.append(f"  {'  ' * depth}{label}: {si(flops)}, {100.0 * flops / total:.1f}%")
    return lines

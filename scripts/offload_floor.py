#!/usr/bin/env python3
"""Judge an offload run of bench_engine.py against the floors the overlapped offloads must keep.

Issue 43 item 1: stage 2/3 + offload (overlap_step) went from 0.690x plain (6d3c329) to 0.645x
(7878aa9) on an H100 and no run said so: the figures were compared by hand, a day later. This
reads bench_engine.py's JSON lines (``--repeat`` >= 2: its median rows) and prints, per variant,
the ratio to plain beside its floor for that card, and for each ``X`` / ``X_torch_pinned`` pair
the step time of each and what the exact-size pinned pages cost (the A/B of the suspected
change). Exit 1 when a floor is missed or the exact pages cost more than ``--ab-tolerance``.

    python3 scripts/offload_floor.py OUT/offload-ab.jsonl [--ab-tolerance 0.03]
"""
from __future__ import annotations

import argparse
import json
import sys

#: card (a word of torch's device name) -> variant -> the lowest acceptable median ratio to plain
#: (bench_engine.py --repeat 3, interleaved). H100: 6d3c329's 0.690 / 0.690 (shared/measurements/
#: 2026-12-05-h100.md) less 3%, their repeats' spread. No floor for other cards: an H200's plain
#: step is faster while offload is bound by the host, so its ratios are lower and not comparable.
FLOORS = {"H100": {"zero2_offload_overlap": 0.67, "zero3_offload_overlap": 0.67}}
PINNED_SUFFIX = "_torch_pinned"


def read(path: str) -> tuple[str, dict[str, dict]]:
    """(the card's name, variant -> its median row); rows without ``summary`` give the card."""
    device, rows = "", {}
    with open(path) as lines:
        for line in lines:
            line = line.strip()
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if record.get("summary"):
                rows[record["variant"]] = record
            elif record.get("device") and not device:
                device = record["device"]
    return device, rows


def floors_for(device: str) -> dict[str, float]:
    return next((floors for card, floors in FLOORS.items() if card in device), {})


def step_ms(row: dict, tokens_per_step: int) -> float | None:
    rate = row.get("tokens_per_s_median")
    return tokens_per_step / rate * 1e3 if rate else None


def judge(device: str, rows: dict[str, dict], tokens_per_step: int, ab_tolerance: float) -> tuple[list[str], bool]:
    """(report lines, whether everything held)."""
    lines, ok = [f"card: {device or 'unknown'}"], True
    floors = floors_for(device)
    if not floors:
        lines.append("no floors for this card: ratios printed, not judged")
    for name, floor in sorted(floors.items()):
        ratio = rows.get(name, {}).get("ratio_vs_plain")
        if ratio is None:
            lines.append(f"{name}: not measured (floor {floor})")
            ok = False
            continue
        held = ratio >= floor
        ok &= held
        lines.append(f"{name}: {ratio:.3f}x plain, floor {floor}: {'held' if held else 'REGRESSED'}")
    for name in sorted(n for n in rows if n + PINNED_SUFFIX in rows):
        exact, pinned = step_ms(rows[name], tokens_per_step), step_ms(rows[name + PINNED_SUFFIX], tokens_per_step)
        if exact is None or pinned is None:
            continue
        cost = exact / pinned - 1
        held = cost <= ab_tolerance
        ok &= held
        lines.append(f"{name}: {exact:.1f} ms/step with exact pinned pages, {pinned:.1f} with torch's pinned "
                     f"allocator: {exact - pinned:+.1f} ms ({cost:+.1%}) {'ok' if held else 'EXACT PAGES COST'}")
    return lines, ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("jsonl", help="bench_engine.py's standard output (JSON lines)")
    p.add_argument("--tokens-per-step", type=int, default=16 * 1024, help="batch x sequence (16 x 1024)")
    p.add_argument("--ab-tolerance", type=float, default=0.03,
                   help="how much slower than torch's pinned allocator the exact pages may be")
    args = p.parse_args(argv)
    device, rows = read(args.jsonl)
    if not rows:
        print(f"{args.jsonl}: no median rows (run bench_engine.py with --repeat 2 or more)", file=sys.stderr)
        return 2
    lines, ok = judge(device, rows, args.tokens_per_step, args.ab_tolerance)
    print("\n".join(f"[offload-floor] {line}" for line in lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

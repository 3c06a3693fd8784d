"""Count what the property tests generated: `python scripts/fuzz_summary.py FUZZ_LOG [--list]`.

FUZZ_LOG is the file `DSLAUNCH_FUZZ_LOG` named while the tests ran (tests/helpers/fuzz.py). Prints,
per property, the inputs generated, how many gave a result, how many a typed error, and the
distinct (error class, first words of the message) pairs; --list prints those pairs too.
"""
from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    outcomes: dict[str, Counter] = defaultdict(Counter)
    with open(argv[0], encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            outcomes[row["property"]][row["outcome"]] += 1
    print("| property | inputs | valid | typed errors | distinct (class, first words) | error classes |")
    print("|---|---:|---:|---:|---:|---|")
    for name, counts in sorted(outcomes.items()):
        errors = {k: v for k, v in counts.items() if k != "ok"}
        classes = sorted({k.split(":", 1)[0] for k in errors})
        print(f"| {name} | {sum(counts.values())} | {counts['ok']} | {sum(errors.values())} | {len(errors)} "
              f"| {', '.join(classes)} |")
    if "--list" in argv:
        for name, counts in sorted(outcomes.items()):
            print(f"\n{name}")
            for outcome, count in counts.most_common():
                print(f"  {count:6d}  {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

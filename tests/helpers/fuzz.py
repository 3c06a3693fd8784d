"""What the property-based (hypothesis) tests share: one settings object and an outcome log.

CI runs each property `DEFAULT_EXAMPLES` times, derandomized (the same inputs every run, so CI
cannot flake); `DSLAUNCH_FUZZ_EXAMPLES=5000` runs thousands locally, and `DSLAUNCH_FUZZ_RANDOM=1`
draws new inputs each run. With `DSLAUNCH_FUZZ_LOG=FILE` every example appends one JSON line
(property, outcome) to FILE; `scripts/fuzz_summary.py FILE` counts them (docs/development/tests.md).
"""
from __future__ import annotations

import json
import os
import re

from hypothesis import HealthCheck, settings

DEFAULT_EXAMPLES = 300
EXAMPLES = int(os.environ.get("DSLAUNCH_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
_RANDOM = bool(os.environ.get("DSLAUNCH_FUZZ_RANDOM"))

FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not _RANDOM, database=None,
                print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                        HealthCheck.function_scoped_fixture])


def fewer(divisor: int) -> settings:
    """The same settings with fewer examples, for a property whose example starts a process or reads files."""
    return settings(FUZZ, max_examples=max(EXAMPLES // divisor, 20))


def record(prop: str, error: BaseException | None = None, label: str | None = None, message: str = "") -> None:
    """Log one example's outcome: 'ok', or the error class (or `label`) and the first words of its message."""
    path = os.environ.get("DSLAUNCH_FUZZ_LOG")
    if not path:
        return
    if error is None and label is None:
        outcome = "ok"
    else:
        text = getattr(error, "message", str(error)) if error is not None else message
        outcome = f"{label or type(error).__name__}: {first_words(text)}"
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"property": prop, "outcome": outcome}) + "\n")


def first_words(message: str, count: int = 3) -> str:
    """The message without what the input put in it (paths, line numbers, quoted values), first words only."""
    text = re.sub(r"^config (dict )?passed to \w+: ", "", message)   # the config loader names a dict's source so
    text = re.sub(r"'.*'|\".*\"", "Q", text, flags=re.DOTALL)   # quoted input, however it nests
    text = re.sub(r"^[^\s:]+:\d+: |\S*/\S*", "", text)      # the path:line that starts a message, paths
    text = re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?", "N", text)
    return " ".join(text.split()[:count])

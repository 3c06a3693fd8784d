"""Which forwarded values are secrets, and how they are hidden in what dslaunch prints.

Dry-run is the CI mode and CI logs are often public: the values of variables whose names
look secret are shown as `<redacted>` everywhere dslaunch itself prints (the plan, console
messages, the failing rank's report) unless `--show-secrets` is given. The plan sent to the
agents keeps the real values. Pure: the extra patterns arrive as a string read at the edge.
"""
from __future__ import annotations

import fnmatch
from dataclasses import replace

from launcher.planning.plan import JobPlan

REDACTED = "<redacted>"
SECRET_PATTERNS = ("*TOKEN*", "*KEY*", "*SECRET*", "*PASSWORD*", "*CREDENTIAL*")
PATTERNS_VARIABLE = "DSLAUNCH_SECRET_PATTERNS"   # extra patterns, comma-separated: "*_PAT,MY_AUTH"
MIN_SCRUBBED_LENGTH = 4   # shorter values would blank out ordinary text ("1", "on")


def secret_patterns(extra: str | None = None) -> tuple[str, ...]:
    """The built-in patterns plus the user's (DSLAUNCH_SECRET_PATTERNS), upper-cased."""
    added = [p.strip().upper() for p in (extra or "").split(",") if p.strip()]
    return SECRET_PATTERNS + tuple(added)


def is_secret(name: str, patterns: tuple[str, ...] = SECRET_PATTERNS) -> bool:
    """True when a variable's name matches one of the (case-insensitive) glob patterns."""
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in patterns)


def secret_values(plan: JobPlan, patterns: tuple[str, ...], inherited: dict[str, str] | None = None) -> frozenset[str]:
    """Every value under a secret-looking name that the plan hands a rank, or that local ranks
    inherit from `inherited` (the launcher's environment)."""
    envs = [rank.env for node in plan.nodes for rank in node.ranks] + [inherited or {}]
    return frozenset(value for env in envs for name, value in env.items() if value and is_secret(name, patterns))


def redact_env(env: dict[str, str], patterns: tuple[str, ...]) -> dict[str, str]:
    return {k: (REDACTED if v and is_secret(k, patterns) else v) for k, v in env.items()}


def redacted_plan(plan: JobPlan, patterns: tuple[str, ...]) -> JobPlan:
    """The same plan with every secret value replaced by `<redacted>` (for printing only)."""
    nodes = tuple(replace(node, ranks=tuple(replace(r, env=redact_env(r.env, patterns)) for r in node.ranks))
                  for node in plan.nodes)
    return replace(plan, nodes=nodes)


class Scrubber:
    """Replaces known secret values inside free text (rank output, error tails)."""

    def __init__(self, values=()):
        # longest first, so a value containing another is replaced whole
        self.values = sorted({v for v in values if len(v) >= MIN_SCRUBBED_LENGTH}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            if value in text:
                text = text.replace(value, REDACTED)
        return text

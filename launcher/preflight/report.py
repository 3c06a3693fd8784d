"""Preflight results as data: one Check per (host, check name), and their renderings.

Pure: no I/O. `PreflightReport.to_json()` is the `--check --json` document of
docs/reference/cli.md; `format_table()` is what a person reads.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Check:
    """The outcome of one check on one host; `hint` says how to fix a failure.

    `warning` marks a pass that deserves a look (e.g. no CUDA on a CPU-only host);
    it is shown as `warn` in the table and as a "warning: " prefix in JSON's detail.
    """

    name: str
    ok: bool
    detail: str = ""
    hint: str | None = None
    warning: bool = False

    def to_dict(self) -> dict:
        detail = f"warning: {self.detail}" if self.warning and self.ok else self.detail
        return {"name": self.name, "ok": self.ok, "detail": detail, "hint": self.hint}


@dataclass(frozen=True)
class HostReport:
    """All checks of one host, in the order they ran."""

    host: str
    checks: tuple[Check, ...] = ()

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    def check(self, name: str) -> Check | None:
        """The check called `name`, or None when it did not run on this host."""
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict:
        return {"host": self.host, "ok": self.ok, "checks": [c.to_dict() for c in self.checks]}


@dataclass(frozen=True)
class PreflightReport:
    """Every host's checks; `ok` when every check on every host passed."""

    hosts: tuple[HostReport, ...]
    elapsed_s: float = field(default=0.0, compare=False)

    @property
    def ok(self) -> bool:
        return bool(self.hosts) and all(h.ok for h in self.hosts)

    @property
    def failed_hosts(self) -> tuple[HostReport, ...]:
        return tuple(h for h in self.hosts if not h.ok)

    def host(self, name: str) -> HostReport | None:
        return next((h for h in self.hosts if h.host == name), None)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "hosts": [h.to_dict() for h in self.hosts]}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def format_table(self) -> str:
        return format_table(self)


def _status(check: Check) -> str:
    if not check.ok:
        return "FAIL"
    return "warn" if check.warning else "ok"


def format_table(report: PreflightReport) -> str:
    """One row per host and check, then each failure again with its hint."""
    rows = [("HOST", "CHECK", "RESULT", "DETAIL")]
    rows += [(h.host, c.name, _status(c), c.detail) for h in report.hosts for c in h.checks]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3]
        for row in rows
    ]
    lines = [line.rstrip() for line in lines]
    failed = report.failed_hosts
    if not failed:
        lines.append("")
        lines.append(f"preflight ok: {len(report.hosts)} host(s) passed every check"
                     + (f" in {report.elapsed_s:.1f} s" if report.elapsed_s else ""))
        return "\n".join(lines)
    lines.append("")
    lines.append(f"preflight failed on {len(failed)} of {len(report.hosts)} host(s): "
                 + ", ".join(h.host for h in failed))
    for host in failed:
        for check in host.checks:
            if check.ok:
                continue
            lines.append(f"  {host.host} {check.name}: {check.detail}")
            if check.hint:
                lines.append(f"    hint: {check.hint}")
    return "\n".join(lines)

"""DeepSpeed hostfiles: text -> hosts. Pure; the only I/O is `load_hostfile`.

Format (one host per line, order = node order)::

    # comment
    worker-0 slots=8
    admin@worker-1:2222 slots=8

Stricter than DeepSpeed where DeepSpeed silently guesses: trailing junk, `slots=0`,
`slots=3x` and a named-but-missing file are errors, not a quiet single-machine run.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from launcher.errors import HostfileError

DEFAULT_HOSTFILE = "/job/hostfile"
# more ranks than any node has GPUs or sane CPU ranks; a typo past it would build a plan that long
MAX_SLOTS = 1024

_HOST_RE = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?P<name>[^@\s:]+)(?::(?P<port>[^@\s:]*))?$")
_SLOTS_RE = re.compile(r"^slots=(?P<value>\S*)$")
# what ssh, pdsh's -w list and a shell word take as one host or user: no option dash, comma,
# bracket range, quote or control character
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_DIGITS_RE = re.compile(r"^[0-9]+$")
# the breaks an editor shows, so that 'line N' is the editor's line N (str.splitlines also breaks
# at U+2028, form feed and others, which an editor shows inside a line)
LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Host:
    """One node: `name` is the bare host name used by filters and MASTER_ADDR."""

    name: str
    slots: int
    user: str | None = None
    port: int | None = None
    line: int = 0

    @property
    def ssh_target(self) -> str:
        """What ssh and pdsh are given: `user@name` or `name`."""
        return f"{self.user}@{self.name}" if self.user else self.name


def parse_hostfile(text: str, path: str = "<hostfile>") -> list[Host]:
    """Parse hostfile text; every problem names `path:line`."""
    hosts: list[Host] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(LINE_BREAK.split(text), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        host = _parse_line(line, path, number)
        if host.name in first_line:
            raise HostfileError(
                f"{path}:{number}: duplicate host '{host.name}' (first on line {first_line[host.name]})",
                hint="list each host once; use slots=N for its GPU count")
        first_line[host.name] = number
        hosts.append(host)
    if not hosts:
        raise HostfileError(f"{path}: no hosts (the file is empty or only comments)",
                            hint="add one line per node, e.g. 'worker-0 slots=8'")
    return hosts


def _slots_hint(tokens: list[str]) -> str:
    """A hint that fits the mistake: spaces around '=', or another key than 'slots'."""
    first = tokens[0]
    if first in ("slots", "slots=", "=") or first.startswith("=") or (len(tokens) > 1 and tokens[1].startswith("=")):
        return "write 'slots=N' with no spaces around '='"
    key, equals, value = first.partition("=")
    if equals:
        return f"the key is 'slots': write 'slots={value or 'N'}'" + (f" (not '{key}')" if key else "")
    if first.isdigit():
        return f"write 'slots={first}'"
    return "write 'HOST slots=N', e.g. 'worker-0 slots=8'"


def _parse_line(line: str, path: str, number: int) -> Host:
    where = f"{path}:{number}"
    tokens = line.split("#", 1)[0].split()
    if len(tokens) < 2:
        raise HostfileError(f"{where}: bad line '{show(line)}': expected 'HOST slots=N'",
                            hint="e.g. 'worker-0 slots=8'")
    match = _HOST_RE.match(tokens[0])
    if not match:
        raise HostfileError(f"{where}: bad host '{show(tokens[0])}'",
                            hint="a host is NAME, USER@NAME or NAME:PORT")
    slots_match = _SLOTS_RE.match(tokens[1])
    if not slots_match:
        raise HostfileError(f"{where}: bad line '{show(line)}': expected 'slots=N' after the host, got '{show(tokens[1])}'",
                            hint=_slots_hint(tokens[1:]))
    value = slots_match.group("value")
    slots = whole_number(value)
    if slots is None or slots < 1:
        raise HostfileError(f"{where}: slots must be a whole number >= 1, got '{show(value)}'",
                            hint="slots is the number of GPUs (or CPU ranks) on that host")
    if slots > MAX_SLOTS:
        raise HostfileError(f"{where}: slots={value} is more than {MAX_SLOTS}",
                            hint="slots is the number of GPUs (or CPU ranks) on that host")
    if len(tokens) > 2:
        raise HostfileError(f"{where}: unexpected text after slots: '{show(' '.join(tokens[2:]))}'",
                            hint="only 'HOST slots=N' is allowed; put remarks after '#'")
    name, user = match.group("name"), match.group("user")
    for what, text in (("host name", name), ("user", user)):
        if text is not None and not _NAME_RE.match(text):
            raise HostfileError(f"{where}: bad {what} '{show(text)}' in '{show(tokens[0])}'",
                                hint="use letters, digits, '-', '.' and '_', not starting with '-' or '.'")
    port = match.group("port")
    port_number = whole_number(port) if port is not None else None
    if port is not None and (port_number is None or not 0 < port_number < 65536):
        raise HostfileError(f"{where}: bad port '{show(port)}' in '{show(tokens[0])}'", hint="use NAME:PORT with 1-65535")
    return Host(name=name, slots=slots, user=user, port=port_number or None, line=number)


def whole_number(text: str) -> int | None:
    """ASCII digits as an int, else None: int() alone takes '٣' and fails on '²' or on 5000 digits."""
    if not _DIGITS_RE.match(text):
        return None
    return int(text) if len(text.lstrip("0")) <= 18 else 10 ** 18


def show(text: str) -> str:
    """Text from the user as a message quotes it: control characters escaped, not sent to the terminal."""
    return text if text.isprintable() else repr(text)[1:-1]


def load_hostfile(path: str | None) -> tuple[list[Host] | None, str | None]:
    """Read the hostfile the user named, or the default one if it exists.

    Returns (hosts, path) or (None, None) when no file was named and the default is
    absent: that alone means "this machine only".
    """
    if path is None:
        if not os.path.isfile(DEFAULT_HOSTFILE):
            return None, None
        path = DEFAULT_HOSTFILE
    if not os.path.exists(path):
        raise HostfileError(f"hostfile '{path}' does not exist",
                            hint="check the path, or drop --hostfile to run on this machine only")
    if os.path.isdir(path):
        raise HostfileError(f"hostfile '{path}' is a directory", hint="give the path of the hostfile itself")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise HostfileError(f"cannot read hostfile '{path}': {exc}") from None
    return parse_hostfile(text, path), path

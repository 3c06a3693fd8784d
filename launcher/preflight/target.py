"""Where and how to reach a host, as the user's OpenSSH would (~/.ssh/config, Include, Match).

`ssh -G` prints the resolved configuration without connecting; where there is no
`ssh` binary, paramiko's SSHConfig is the fallback (it knows no Include).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class SshTarget:
    """One host's resolved ssh settings. `alias` is the name in the hostfile."""

    alias: str
    hostname: str
    port: int = 22
    user: str | None = None
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    known_hosts_files: tuple[str, ...] = ()
    strict_host_key_checking: str = "ask"
    proxy_command: str | None = None
    host_key_alias: str | None = None

    @property
    def destination(self) -> str:
        """`user@hostname:port` as a human reads it in a detail line."""
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.hostname}:{self.port}"

    @property
    def ssh_words(self) -> str:
        """The alias with the -p / user@ that reproduce this target with plain ssh."""
        port = f"-p {self.port} " if self.port != 22 else ""
        user = f"{self.user}@" if self.user else ""
        return f"{port}{user}{self.alias}"


def parse_ssh_g(text: str) -> dict[str, list[str]]:
    """`ssh -G` output -> {lowercased key: [values in order]} (keys like identityfile repeat)."""
    options: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            options.setdefault(key.lower(), []).append(value.strip())
    return options


def target_from_options(alias: str, options: dict[str, list[str]], user: str | None = None,
                        port: int | None = None) -> SshTarget:
    """Build a target from resolved options; explicit user/port win, as on ssh's command line."""
    def first(key: str, default: str | None = None) -> str | None:
        values = options.get(key)
        return values[0] if values else default

    def paths(key: str) -> tuple[str, ...]:
        words = [w for v in options.get(key, []) for w in v.split()]
        return tuple(os.path.expanduser(w) for w in words if w.lower() != "none")

    proxy = first("proxycommand")
    jump = first("proxyjump")
    if (not proxy or proxy == "none") and jump and jump != "none":
        proxy = f"ssh -W %h:%p {jump}"
    return SshTarget(
        alias=alias,
        hostname=first("hostname", alias) or alias,
        port=int(port if port is not None else first("port", "22") or 22),
        user=user or first("user"),
        identity_files=paths("identityfile"),
        identities_only=(first("identitiesonly", "no") or "no").lower() == "yes",
        known_hosts_files=paths("userknownhostsfile") + paths("globalknownhostsfile"),
        strict_host_key_checking=(first("stricthostkeychecking", "ask") or "ask").lower(),
        proxy_command=None if not proxy or proxy == "none" else proxy,
        host_key_alias=first("hostkeyalias"),
    )


def resolve_target(alias: str, user: str | None = None, port: int | None = None,
                   timeout: float = 5.0) -> SshTarget:
    """Resolve `alias` through the user's ssh configuration (local only, no connection)."""
    ssh = shutil.which("ssh")
    if ssh:
        argv = [ssh, "-G"] + (["-p", str(port)] if port else []) + (["-l", user] if user else [])
        try:
            out = subprocess.run(argv + ["--", alias], capture_output=True, text=True,
                                 timeout=timeout, stdin=subprocess.DEVNULL)
            if out.returncode == 0:
                return target_from_options(alias, parse_ssh_g(out.stdout), user, port)
        except (OSError, subprocess.SubprocessError):
            pass
    return _resolve_with_paramiko(alias, user, port)


def _resolve_with_paramiko(alias: str, user: str | None, port: int | None) -> SshTarget:
    import paramiko  # lazily: the launcher's start stays cheap

    path = os.path.expanduser("~/.ssh/config")
    found: dict = {}
    if os.path.exists(path):
        found = dict(paramiko.SSHConfig.from_path(path).lookup(alias))
    options = {k.lower(): v if isinstance(v, list) else [str(v)] for k, v in found.items()}
    options.setdefault("userknownhostsfile", ["~/.ssh/known_hosts"])
    options.setdefault("globalknownhostsfile", ["/etc/ssh/ssh_known_hosts"])
    if "identityfile" not in options:
        options["identityfile"] = [f"~/.ssh/id_{t}" for t in ("rsa", "ecdsa", "ed25519")]
    return target_from_options(alias, options, user, port)

"""Pure: why an ssh connection failed, as a failed `ssh` Check with a hint that fixes it.

The ssh client raises `SshFailure` (kind + facts) for what it detects itself and lets
socket/paramiko exceptions through; `classify` turns either into a Check.
"""
from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

from launcher.preflight.report import Check

RESOLVE, REFUSED, TIMEOUT, UNREACHABLE, AUTH, HOSTKEY_UNKNOWN, HOSTKEY_CHANGED, PROTOCOL = (
    "resolve", "refused", "timeout", "unreachable", "auth", "hostkey-unknown", "hostkey-changed",
    "protocol")


@dataclass
class SshFailure(Exception):
    """A failure the ssh client diagnosed; `facts` feed the detail and hint."""

    kind: str
    facts: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.kind}: {self.facts}"


def _keyscan(t) -> str:
    port = f"-p {t.port} " if t.port != 22 else ""
    known = t.known_hosts_files[0] if t.known_hosts_files else "~/.ssh/known_hosts"
    return f"ssh-keyscan {port}{t.hostname} >> {known}"


def classify(error: BaseException, target, timeout: float) -> Check:
    """Map an exception from connecting to `target` (an SshTarget) to a failed ssh Check."""
    kind, facts = _kind_of(error)
    where = f"{target.hostname}:{target.port}"
    name = target.alias
    if kind == RESOLVE:
        return Check("ssh", False, f"host name '{target.hostname}' does not resolve ({facts['why']})",
                     f"check the name '{name}' in the hostfile, or give it a HostName in "
                     f"~/.ssh/config or an /etc/hosts entry")
    if kind == REFUSED:
        return Check("ssh", False, f"connection refused by {where} (no sshd listening there)",
                     f"start sshd on {name} (e.g. systemctl start ssh), or give the right port "
                     f"with --ssh_port / 'host:port' in the hostfile / Port in ~/.ssh/config")
    if kind == TIMEOUT:
        return Check("ssh", False, f"timed out after {timeout:g} s connecting to {where} "
                     f"({facts.get('stage', 'connect')})",
                     f"is {name} up? a firewall may drop port {target.port}; try: ssh -v {target.ssh_words}")
    if kind == UNREACHABLE:
        return Check("ssh", False, f"{where} is unreachable ({facts['why']})",
                     f"no route from here to {target.hostname}: check the address and the network")
    if kind == AUTH:
        tried = facts.get("tried") or ["no keys (none found, no agent)"]
        allowed = ",".join(facts.get("allowed") or []) or "?"
        key = next((k for k in facts.get("key_files", [])), None)
        ident = f"-i {key} " if key else ""
        port = f"-p {target.port} " if target.port != 22 else ""
        user = f"{target.user}@" if target.user else ""
        return Check("ssh", False,
                     f"authentication failed for {user}{where} (server allows: {allowed}; "
                     f"tried: {'; '.join(tried)})",
                     f"install your public key on {name}: ssh-copy-id {ident}{port}{user}{name} "
                     f"(dslaunch never asks for passwords)")
    if kind == HOSTKEY_UNKNOWN:
        return Check("ssh", False,
                     f"host key of {where} is not in known_hosts ({facts.get('key_type', '?')} "
                     f"{facts.get('fingerprint', '')})".rstrip(),
                     f"verify the fingerprint, then add it: {_keyscan(target)} "
                     f"(or connect once with: ssh {target.ssh_words})")
    if kind == HOSTKEY_CHANGED:
        return Check("ssh", False,
                     f"HOST KEY CHANGED for {where}: it offers {facts.get('fingerprint', '?')}, "
                     f"known_hosts has {facts.get('known_fingerprint', '?')} "
                     "(reinstalled host, or someone in the middle)",
                     f"if {name} was reinstalled: ssh-keygen -R {_known_name(target)} && "
                     f"{_keyscan(target)}")
    return Check("ssh", False, f"ssh to {where} failed: {facts.get('why') or error}",
                 f"try: ssh -v {target.ssh_words}")


def _known_name(target) -> str:
    return target.hostname if target.port == 22 else f"'[{target.hostname}]:{target.port}'"


def _kind_of(error: BaseException) -> tuple[str, dict]:
    if isinstance(error, SshFailure):
        return error.kind, error.facts
    if isinstance(error, socket.gaierror):
        return RESOLVE, {"why": error.strerror or str(error)}
    if isinstance(error, (socket.timeout, TimeoutError)):
        return TIMEOUT, {}
    if isinstance(error, ConnectionRefusedError):
        return REFUSED, {}
    if isinstance(error, OSError) and error.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return UNREACHABLE, {"why": error.strerror or str(error)}
    if isinstance(error, OSError) and error.errno == errno.ECONNREFUSED:
        return REFUSED, {}
    if isinstance(error, OSError) and error.errno == errno.ETIMEDOUT:
        return TIMEOUT, {}
    text = str(error) or type(error).__name__
    if "timed out" in text.lower() or "timeout" in text.lower():
        return TIMEOUT, {"stage": text}
    return PROTOCOL, {"why": f"{type(error).__name__}: {text}"}

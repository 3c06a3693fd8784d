"""The ssh seam of the preflight: paramiko, driven at the transport level.

Driving the transport ourselves (instead of SSHClient.connect) lets us tell the
failure kinds apart: the host key is checked against known_hosts before any
authentication (unknown and changed keys never pass; nothing is ever added), the
server's allowed auth methods are asked for, and every key offered is recorded.
No password or keyboard-interactive auth is ever tried, so nothing can prompt.
"""
from __future__ import annotations

import os
import socket
import time

from launcher.preflight.classify import AUTH, HOSTKEY_CHANGED, HOSTKEY_UNKNOWN, SshFailure
from launcher.preflight.target import SshTarget


class ParamikoConnector:
    """connect(target, timeout) -> Session; the only place that imports paramiko."""

    def connect(self, target: SshTarget, timeout: float) -> "Session":
        import paramiko  # lazily: `dslaunch --help` and --dry-run never pay for it

        deadline = time.monotonic() + timeout
        sock = _open_socket(paramiko, target, timeout)
        transport = paramiko.Transport(sock)
        try:
            transport.banner_timeout = timeout
            transport.handshake_timeout = timeout
            transport.auth_timeout = timeout
            transport.start_client(timeout=_left(deadline))
            note = _check_host_key(paramiko, transport, target)
            method = _authenticate(paramiko, transport, target, deadline)
        except BaseException:
            transport.close()
            raise
        return Session(transport, method if not note else f"{method}; {note}")


def _left(deadline: float) -> float:
    return max(0.1, deadline - time.monotonic())


def _open_socket(paramiko, target: SshTarget, timeout: float):
    if target.proxy_command:
        command = (target.proxy_command.replace("%h", target.hostname)
                   .replace("%p", str(target.port)).replace("%r", target.user or ""))
        return paramiko.ProxyCommand(command)
    return socket.create_connection((target.hostname, target.port), timeout=timeout)


def _fingerprint(key) -> str:
    import base64
    import hashlib

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _check_host_key(paramiko, transport, target: SshTarget) -> str:
    """Raise SshFailure when the server's key is unknown or differs; '' when it matches."""
    key = transport.get_remote_server_key()
    known = paramiko.HostKeys()
    for path in target.known_hosts_files:
        if os.path.isfile(path):
            try:
                known.load(path)
            except (OSError, paramiko.SSHException):
                continue
    name = target.host_key_alias or target.hostname
    lookup_name = name if target.port == 22 or target.host_key_alias else f"[{name}]:{target.port}"
    entries = known.lookup(lookup_name) or {}
    facts = {"key_type": key.get_name(), "fingerprint": _fingerprint(key)}
    if key.get_name() in entries:
        if entries[key.get_name()] == key:
            return ""
        facts["known_fingerprint"] = _fingerprint(entries[key.get_name()])
        raise SshFailure(HOSTKEY_CHANGED, facts)
    if entries:  # known under another key type: OpenSSH treats that as a changed key too
        other = next(iter(entries.values()))
        facts["known_fingerprint"] = f"{other.get_name()} {_fingerprint(other)}"
        raise SshFailure(HOSTKEY_CHANGED, facts)
    if target.strict_host_key_checking in ("no", "off"):
        return "host key not checked (StrictHostKeyChecking no in ssh config)"
    raise SshFailure(HOSTKEY_UNKNOWN, facts)


def _candidate_keys(paramiko, target: SshTarget):
    """(label, key) in OpenSSH's order: agent keys, then identity files; plus skip notes."""
    keys, notes = [], []
    if not target.identities_only and os.environ.get("SSH_AUTH_SOCK"):
        try:
            for key in paramiko.Agent().get_keys():
                keys.append((f"agent key {key.get_name()}", key))
        except (OSError, paramiko.SSHException) as e:
            notes.append(f"agent unusable ({e})")
    for path in target.identity_files:
        if not os.path.isfile(path):
            continue
        try:
            keys.append((path, paramiko.PKey.from_path(path)))
        except paramiko.PasswordRequiredException:
            notes.append(f"{path} is encrypted (load it into ssh-agent)")
        except (OSError, ValueError, paramiko.SSHException) as e:
            notes.append(f"{path} unreadable ({type(e).__name__})")
    return keys, notes


def _authenticate(paramiko, transport, target: SshTarget, deadline: float) -> str:
    """Public-key auth only; raise SshFailure(AUTH) listing the methods and keys tried."""
    user = target.user or _local_user()
    allowed: list[str] = []
    try:
        transport.auth_none(user)
        return "no authentication needed"
    except paramiko.BadAuthenticationType as e:
        allowed = list(e.allowed_types)
    except paramiko.AuthenticationException:
        pass
    keys, notes = _candidate_keys(paramiko, target)
    tried = []
    if "publickey" in allowed or not allowed:
        for label, key in keys:
            if time.monotonic() > deadline:
                raise socket.timeout("authentication")
            try:
                transport.auth_publickey(user, key)
            except paramiko.AuthenticationException:
                tried.append(f"publickey {label}")
                continue
            if transport.is_authenticated():
                return f"key {label}"
    facts = {"allowed": allowed, "tried": tried + notes,
             "key_files": [p for p in target.identity_files if os.path.isfile(p + ".pub")]}
    raise SshFailure(AUTH, facts)


def _local_user() -> str:
    import getpass

    return getpass.getuser()


class Session:
    """An authenticated connection; `start` runs one remote command with a stdin pipe."""

    def __init__(self, transport, auth: str):
        self.transport = transport
        self.auth = auth

    def start(self, command: str, timeout: float) -> "RemoteProcess":
        channel = self.transport.open_session(timeout=timeout)
        channel.exec_command(command)
        return RemoteProcess(channel)

    def close(self) -> None:
        self.transport.close()


class RemoteProcess:
    """A running remote command: write stdin, read stdout lines with a deadline, get rc."""

    def __init__(self, channel):
        self.channel = channel
        self._buffer = b""

    def write(self, data: bytes) -> None:
        self.channel.sendall(data)

    def close_stdin(self) -> None:
        self.channel.shutdown_write()

    def readline(self, timeout: float) -> bytes | None:
        """The next stdout line, or None at EOF; raises socket.timeout past `timeout`."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("remote command")
            self.channel.settimeout(left)
            chunk = self.channel.recv(65536)
            if not chunk:
                line, self._buffer = self._buffer, b""
                return line or None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def wait(self, timeout: float) -> tuple[int, str]:
        """Exit status and stderr (last 2 kB) once the command ends."""
        deadline = time.monotonic() + timeout
        while not self.channel.exit_status_ready():
            if time.monotonic() > deadline:
                raise socket.timeout("remote command")
            time.sleep(0.01)
        err = b""
        while self.channel.recv_stderr_ready():
            err += self.channel.recv_stderr(65536)
        return self.channel.recv_exit_status(), err.decode(errors="replace")[-2048:]

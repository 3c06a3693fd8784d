"""The control channel between dslaunch and its agents: JSON lines over TCP.

Readable on purpose (no base64, no pickles): each message is one JSON object with a
"type". Agents dial dslaunch, so every runner (ssh, pdsh, mpirun, srun) gets the same
channel, and forwarded env values travel inside it instead of on a command line.

Agent -> dslaunch: hello (answering the challenge), port, output, failing, exit, heartbeat, error, done;
under --stall_timeout also progress and stacks.
dslaunch -> agent: challenge, pick_port, plan, stop, heartbeat; under --stall_timeout also stacks (a
straggler's), dump_stacks (the job went quiet) and stop_hung.
"""
from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass

HEARTBEAT_SECONDS = 1.0
DRY_RUN_ENDPOINT_HOST = "<dslaunch-address>"

@dataclass(frozen=True)
class ControlEndpoint:
    """Where agents call back to dslaunch, and pdsh's one-time ticket (launcher/handshake.py)."""

    host: str = DRY_RUN_ENDPOINT_HOST
    port: int = 0
    ticket: str = "<ticket>"

    def address(self) -> str:
        return f"{self.host}:{self.port or '<port>'}"


class Channel:
    """One connection; `send` is thread-safe, `recv` returns None at end of stream."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._reader = sock.makefile("rb")
        self._lock = threading.Lock()
        self.closed = False

    def send(self, message: dict) -> bool:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self.closed = True
                return False

    def recv(self) -> dict | None:
        try:
            line = self._reader.readline()
        except (OSError, ValueError):
            return None
        if not line:
            return None
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return {"type": "garbled", "data": line[:200].decode("utf-8", "replace")}

    def close(self) -> None:
        with self._lock:
            self.closed = True
        shutdown_quietly(self.sock)
        self.sock.close()


def shutdown_quietly(sock: socket.socket) -> None:
    """Shut both directions of a socket; one already gone is no error."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def keepalive(sock: socket.socket) -> None:
    """TCP keepalive so a dead peer is noticed even when nothing is sent."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def free_port(host: str = "") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]

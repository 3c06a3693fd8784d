"""Every agent connection of the controller in one selector loop: accept, challenge, framing, buffers.

One thread owns the listening socket and all agent sockets (a thread per connection cost
about 0.5 MiB and a GIL hand-off per message at 1024 nodes). It hands the controller's logic
decoded messages as events, in two queues:

  events  (node_rank, message) for everything but rank output: hello, exit, error, done,
          eof, replies. Few and urgent; the controller handles them first in each turn.
  output  (node_rank, [raw JSON lines]) per socket read; decoded by the controller in
          batches, after the events, so a failure never waits behind a backlog of output.

Writes never block the caller: `Connection.send` writes what the kernel takes at once and
leaves the rest to the loop, so a stop reaches every agent in one pass over the sockets.
"""
from __future__ import annotations

import json
import queue
import selectors
import socket
import threading
import time
from typing import Callable

from launcher.handshake import new_nonce
from launcher.wire import keepalive, shutdown_quietly

OUTPUT_PREFIX = b'{"type":"output"'   # how wire.Channel encodes an agent's output message
READ_BYTES = 1 << 18
HELLO_TIMEOUT = 10.0
STOP_JOIN_SECONDS = 10.0   # the loop ends within one turn of a stop; this only bounds a wedged one

# admit(hello, nonce, source) -> why it is refused, or None
Admit = Callable[[object, str, tuple], "str | None"]


class Connection:
    """One agent's socket as the controller sees it; `send` is thread-safe and never blocks."""

    def __init__(self, sock: socket.socket, source: tuple, inbox: "Inbox"):
        self.sock = sock
        self.source = source
        self.node_rank: int | None = None   # set once the agent proved its key
        self.nonce = ""
        self.hello_deadline = 0.0
        self.closed = False
        self._inbox = inbox
        self._lock = threading.Lock()
        self._out = bytearray()
        self._in = b""

    def send(self, message: dict) -> bool:
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self.closed:
                return False
            if not self._out:
                try:
                    data = data[self.sock.send(data):]
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed = True
                    return False
            if not data:
                return True
            self._out += data
        self._inbox.want_write(self)
        return True

    def close(self) -> None:
        """End the connection (the loop releases the socket)."""
        with self._lock:
            self.closed = True
        shutdown_quietly(self.sock)
        self._inbox.want_write(self)

    def flush(self) -> bool:
        """Write what is pending; True when nothing is left."""
        with self._lock:
            if self._out and not self.closed:
                try:
                    del self._out[:self.sock.send(self._out)]
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed = True
            return not self._out or self.closed

    def take_lines(self, data: bytes) -> list[bytes]:
        """The complete lines in what arrived (a partial last line waits for the rest)."""
        if b"\n" not in data:
            self._in += data
            return []
        lines = (self._in + data).split(b"\n")
        self._in = lines.pop()
        return [line for line in lines if line]


class Inbox:
    """The selector loop; starts at once (agents may dial before the controller runs)."""

    def __init__(self, listener: socket.socket, admit: Admit, refused: Callable[[str], None]):
        self.listener = listener
        self.events: queue.Queue = queue.Queue()
        self.output: queue.Queue = queue.Queue()
        self._admit = admit
        self._refused = refused
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._wants: list[Connection] = []
        self._wants_lock = threading.Lock()
        self._waiting_hello: set[Connection] = set()
        self._stopped = False
        self.heard: dict[int, float] = {}   # node rank -> when its socket last had data (monotonic)
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="dslaunch-inbox", daemon=True)
        self._thread.start()

    def want_write(self, connection: Connection) -> None:
        with self._wants_lock:
            self._wants.append(connection)
        self._wake()

    def stop(self) -> None:
        """End the loop and wait for it: once this returns, no thread of ours touches the listener
        or an agent socket, so the caller may close the listener (a loop still in accept() on a
        closed listener could pick up whatever socket next gets its file descriptor number)."""
        self._stopped = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=STOP_JOIN_SECONDS)

    def _wake(self) -> None:
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass   # the pipe is full: the loop is awake already

    def _loop(self) -> None:
        while not self._stopped:
            try:
                ready = self._selector.select(timeout=1.0)
            except OSError:
                return
            control: list[tuple[int, dict]] = []
            for key, mask in ready:
                if key.data == "listener":
                    self._accept()
                elif key.data == "wake":
                    self._apply_wants()
                else:
                    if mask & selectors.EVENT_WRITE:
                        self._flushed(key.data)
                    if mask & selectors.EVENT_READ:
                        self._read(key.data, control)
            for item in control:   # after this turn's output: a "done" implies its lines are queued
                self.events.put(item)
            if self._waiting_hello:
                self._expire_hellos()
        self._close_all()

    def _close_all(self) -> None:
        """The job is over: an agent still connected sees dslaunch go away (and stops its ranks)."""
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, Connection):
                with key.data._lock:
                    key.data.closed = True
                key.data.sock.close()
        self._selector.close()
        self._wake_read.close()
        self._wake_write.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, source = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:   # the listener was closed: the job is over
                try:
                    self._selector.unregister(self.listener)
                except (KeyError, ValueError, OSError):
                    pass
                return
            keepalive(sock)
            sock.setblocking(False)
            connection = Connection(sock, source, self)
            connection.nonce = new_nonce()
            connection.hello_deadline = time.monotonic() + HELLO_TIMEOUT
            self._selector.register(sock, selectors.EVENT_READ, connection)
            self._waiting_hello.add(connection)
            connection.send({"type": "challenge", "nonce": connection.nonce})

    def _apply_wants(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        with self._wants_lock:
            wants, self._wants = self._wants, []
        for connection in dict.fromkeys(wants):
            if connection.closed:
                self._drop(connection)
            elif not connection.flush():
                self._watch(connection, selectors.EVENT_READ | selectors.EVENT_WRITE)

    def _flushed(self, connection: Connection) -> None:
        if connection.flush() and not connection.closed:
            self._watch(connection, selectors.EVENT_READ)
        elif connection.closed:
            self._drop(connection)

    def _watch(self, connection: Connection, events: int) -> None:
        try:
            self._selector.modify(connection.sock, events, connection)
        except (KeyError, ValueError, OSError):
            pass

    def _read(self, connection: Connection, control: list) -> None:
        try:
            data = connection.sock.recv(READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)
            return
        lines = connection.take_lines(data)
        if connection.node_rank is None and lines:
            lines = self._hello(connection, lines)
            if connection.node_rank is None:
                return
        node_rank = connection.node_rank
        self.heard[node_rank] = time.monotonic()   # alive, however long its lines wait to be printed
        output = [line for line in lines if line.startswith(OUTPUT_PREFIX)]
        if output:
            self.output.put((node_rank, output))
        if len(output) < len(lines):
            control += [(node_rank, decode(line)) for line in lines if not line.startswith(OUTPUT_PREFIX)]

    def _hello(self, connection: Connection, lines: list[bytes]) -> list[bytes]:
        """Check the first line; the lines after it when the agent is admitted."""
        self._waiting_hello.discard(connection)
        hello = decode(lines[0])
        refused = self._admit(hello, connection.nonce, connection.source)
        if refused:
            self._refuse(connection, refused)
            return []
        connection.node_rank = hello["node_rank"]
        self.events.put((connection.node_rank, {**hello, "channel": connection}))
        return lines[1:]

    def _refuse(self, connection: Connection, why: str) -> None:
        source = connection.source
        self._refused(f"refused a connection from {source[0]}:{source[1]}: {why}; the job goes on")
        connection.closed = True
        self._drop(connection)

    def _expire_hellos(self) -> None:
        now = time.monotonic()
        for connection in [c for c in self._waiting_hello if now > c.hello_deadline]:
            self._waiting_hello.discard(connection)
            self._refuse(connection, "no hello")

    def _drop(self, connection: Connection) -> None:
        self._waiting_hello.discard(connection)
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError, OSError):
            return   # dropped already
        with connection._lock:
            connection.closed = True
        try:
            connection.sock.close()
        except OSError:
            pass
        if connection.node_rank is not None:
            self.events.put((connection.node_rank, {"type": "eof"}))


def decode(line: bytes) -> dict:
    try:
        message = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        message = None
    if not isinstance(message, dict) or "type" not in message:
        return {"type": "garbled", "data": line[:200].decode("utf-8", "replace")}
    return message


def decode_batch(lines: list[bytes]) -> list[dict]:
    """Many lines at the cost of about one json.loads (one bad line falls back to one at a time)."""
    try:
        return json.loads(b"[" + b",".join(lines) + b"]")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return [decode(line) for line in lines]


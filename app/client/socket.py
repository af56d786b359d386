"""The shared install's client: requests to `board agent` over its Unix socket, one JSON line each way.

Kept to the interpreter's own C modules (_socket, _thread; app.wire's _json) so that `board status` and `board book`
start fast: the socket and threading packages import enum, selectors and weakref sets, which cost a quick command
more than its request (issue 37). tests/unit/test_quick.py pins what the quick path loads.
"""

from __future__ import annotations

import _socket
import _thread
import time
from collections.abc import Iterator

from app import wire
from app.client.stamps import receive
from app.errors import BoardError, ServiceDown, error_for

TYPE_CHECKING = False  # typing stays off the quick path; the type checker takes this name as True
if TYPE_CHECKING:
    from typing import Any

DOWN = "the board service is not running (systemctl status board-agent)"


def _group_of(path: str) -> str:
    """The socket's group: the members' group, which is what a refused user needs to be in."""
    import grp  # start-up: only a refused client asks for the socket's group
    import os

    try:
        return grp.getgrgid(os.stat(path).st_gid).gr_name
    except (OSError, KeyError):
        return "board"


def _resend_safe(op: str) -> bool:
    """Safe to send again after the service restarted while answering: it changes nothing (app.operations); a
    change may have landed before the service died."""
    from app.operations import OPERATIONS  # start-up: only a request the service dropped asks

    found = OPERATIONS.get(op)
    return found is not None and found.resend_safe


class NotSent(ConnectionError):
    """The service had closed the line before the request went out (idle timeout, a refusal at the door):
    it never read it, so any request, a write too, is safe to send again on a new connection."""


class Lines:
    """The lines the service sends on one connection, read as BufferedReader.readline reads them (a line of at most
    `limit` bytes; b"" once the service has closed), over recv: socket.makefile would need the socket package."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self._buffer = bytearray()
        self._scanned = 0  # no newline before this offset of the buffer

    def readline(self, limit: int = -1) -> bytes:
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0 and (limit < 0 or end < limit):
                return self._take(end + 1)
            if 0 <= limit <= len(self._buffer):
                return self._take(limit)
            self._scanned = len(self._buffer)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return self._take(len(self._buffer))
            self._buffer += chunk

    def __iter__(self) -> Iterator[bytes]:  # line by line until the service closes, as a file's lines
        return iter(self.readline, b"")

    def _take(self, size: int) -> bytes:
        line = bytes(self._buffer[:size])
        del self._buffer[:size]
        self._scanned = 0
        return line


class SocketClient:
    transport = "socket"

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.path, self.timeout = path, timeout
        self._sock: _socket.socket | None = None
        self._reader: Lines | None = None
        self._next_id = 0
        self._closed = False
        # threading.Lock is this very lock: the board calls from more than one thread; one request at a time per line
        self._lock = _thread.allocate_lock()
        self._streams: list[_socket.socket] = []

    def connect(self) -> _socket.socket:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except FileNotFoundError:
            sock.close()
            raise ServiceDown(DOWN) from None
        except ConnectionRefusedError:
            sock.close()
            raise ServiceDown(DOWN) from None
        except PermissionError:
            sock.close()
            raise error_for(4, f"no access to the board service at {self.path}; ask an admin to add you to"
                               f" group {_group_of(self.path)}") from None
        except OSError as error:
            sock.close()
            raise ServiceDown(f"{DOWN}: {error.strerror or error}") from None
        return sock

    def _send(self, sock: _socket.socket, reader: Lines, op: str, args: dict) -> dict:
        self._next_id += 1
        try:
            sock.sendall(wire.encode({"v": wire.VERSION, "id": self._next_id, "op": op, "args": args}))
        except (BrokenPipeError, ConnectionResetError):
            # A refusal at the door (too many connections, not a member) comes before any request is read,
            # and the service may have closed by now: its one line is still waiting here. Closed with our last
            # request unread, the line may instead read as reset: either way this request never went out.
            try:
                line = reader.readline(wire.MAX_MESSAGE + 1)
            except OSError:
                line = b""
            if line:
                return receive(line)
            raise NotSent() from None
        line = reader.readline(wire.MAX_MESSAGE + 1)
        if not line:
            raise ConnectionResetError("the service closed the connection")
        return receive(line)

    def call(self, op: str, **args: object) -> Any:  # the reply's JSON value, as LocalClient.call
        with self._lock:
            reply = self._call(op, args)
        if reply.get("ok"):
            return reply.get("result")
        error = reply.get("error") or {}
        refused = error_for(int(error.get("code", 1)), str(error.get("message", "the service refused")))
        if isinstance(search := error.get("earliest"), dict):  # worded when shown (app.errors.BoardError.rest)
            refused.rest = lambda: self.call("earliest", **search)["words"]
        raise refused

    def _call(self, op: str, args: dict) -> dict:
        for attempt in (1, 2):
            try:
                if self._sock is None or self._reader is None:  # set and dropped together
                    self._sock = self.connect()
                    self._reader = Lines(self._sock)
                reply = self._send(self._sock, self._reader, op, args)
                if reply.get("id") != self._next_id:
                    # Said to no request of ours (a refusal at the door): the service closes this line without
                    # reading it, so the next request, sent before that close, would be lost on it.
                    self._drop()
                break
            except (ConnectionError, TimeoutError, ValueError) as error:
                self._drop()
                if isinstance(error, TimeoutError):
                    raise ServiceDown(f"the board service did not answer within {self.timeout:g} s; try again") from None
                if attempt == 2 or (not _resend_safe(op) and not isinstance(error, NotSent)):
                    raise ServiceDown(f"the board service stopped while answering ({op}); check with"
                                      " 'board list --mine' before trying again") from None
        return reply

    def stream(self, op: str, args: dict) -> tuple[_socket.socket, Lines, Any]:
        """A connection of its own for a stream (subscribe, register): (socket, reader, the first reply's result)."""
        sock = self.connect()
        sock.settimeout(None)
        reader = Lines(sock)
        try:
            reply = self._send(sock, reader, op, args)
        except (ConnectionError, ValueError):
            sock.close()
            raise ServiceDown(DOWN) from None
        if not reply.get("ok"):
            sock.close()
            error = reply.get("error") or {}
            raise error_for(int(error.get("code", 1)), str(error.get("message", "the service refused")))
        return sock, reader, reply.get("result")

    def subscribe(self, kinds: tuple[str, ...]) -> Iterator[dict]:
        """Events until close(); when the service goes away, a `down` event, then `reconnected` once it is back."""
        delay = 0.2
        down = False
        while not self._closed:
            try:
                sock, reader, _ = self.stream("subscribe", {"kinds": list(kinds)})
            except BoardError as error:
                if not down:
                    down = True
                    yield {"event": "down", "message": str(error)}
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if down:
                yield {"event": "reconnected"}
            down, delay = False, 0.2
            self._streams.append(sock)
            try:
                while line := reader.readline(wire.MAX_MESSAGE + 1):
                    yield receive(line)
            except (OSError, ValueError):
                pass
            finally:
                sock.close()
            if not self._closed:
                down = True
                yield {"event": "down", "message": DOWN}

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._reader = None

    def close(self) -> None:
        self._closed = True
        self._drop()
        for sock in self._streams:
            try:
                sock.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

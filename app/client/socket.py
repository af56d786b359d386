"""The shared install's client: requests to `board agent` over its Unix socket, one JSON line each way.

Kept to json and socket so that `board status` and `board book` start fast.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

from app import wire
from app.client.stamps import receive
from app.errors import BoardError, ServiceDown, error_for

TYPE_CHECKING = False  # typing stays off the quick path; the type checker takes this name as True
if TYPE_CHECKING:
    from io import BufferedReader
    from typing import Any

DOWN = "the board service is not running (systemctl status board-agent)"
# Reads are safe to send again after the service restarted; a write may have landed before it died.
READS = frozenset({"whoami", "fleet", "status", "plan", "next_free", "get", "list", "window", "all_bookings", "log",
                   "gateway_state", "key_list", "usage", "earliest"})


def _group_of(path: str) -> str:
    """The socket's group: the members' group, which is what a refused user needs to be in."""
    import grp  # start-up: only a refused client asks for the socket's group
    import os

    try:
        return grp.getgrgid(os.stat(path).st_gid).gr_name
    except (OSError, KeyError):
        return "board"


class NotSent(ConnectionError):
    """The service had closed the line before the request went out (idle timeout, a refusal at the door):
    it never read it, so any request, a write too, is safe to send again on a new connection."""


class SocketClient:
    transport = "socket"

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.path, self.timeout = path, timeout
        self._sock: socket.socket | None = None
        self._reader: BufferedReader | None = None
        self._next_id = 0
        self._closed = False
        self._lock = threading.Lock()  # the board calls from more than one thread; one request at a time per line
        self._streams: list[socket.socket] = []

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
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

    def _send(self, sock: socket.socket, reader: BufferedReader, op: str, args: dict) -> dict:
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
                    self._reader = self._sock.makefile("rb")
                reply = self._send(self._sock, self._reader, op, args)
                if reply.get("id") != self._next_id:
                    # Said to no request of ours (a refusal at the door): the service closes this line without
                    # reading it, so the next request, sent before that close, would be lost on it.
                    self._drop()
                break
            except (ConnectionError, BrokenPipeError, socket.timeout, ValueError) as error:
                self._drop()
                if isinstance(error, socket.timeout):
                    raise ServiceDown(f"the board service did not answer within {self.timeout:g} s; try again") from None
                if attempt == 2 or (op not in READS and not isinstance(error, NotSent)):
                    raise ServiceDown(f"the board service stopped while answering ({op}); check with"
                                      " 'board list --mine' before trying again") from None
        return reply

    def stream(self, op: str, args: dict) -> tuple[socket.socket, BufferedReader, Any]:
        """A connection of its own for a stream (subscribe, register): (socket, reader, the first reply's result)."""
        sock = self.connect()
        sock.settimeout(None)
        reader = sock.makefile("rb")
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
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

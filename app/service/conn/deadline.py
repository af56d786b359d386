"""Reading what a client sends with one deadline for the whole message, however slowly its bytes come.

A per-recv timeout lets a client that sends a byte every few seconds hold its reader for ever. Here
each read waits only for what is left of the deadline, so a slow or silent client costs its file
descriptor (and, behind the socket's caps, its thread) for a bounded time and nothing else.
"""

from __future__ import annotations

import io
import select
import socket
import time


class DeadlineStream(io.RawIOBase):
    """A socket's bytes; a read waits at most until `until` (time.monotonic()), or for ever when it is None.
    Past it, a read with nothing to take raises TimeoutError. The socket's own timeout is left for sending."""

    def __init__(self, sock: socket.socket, until: float | None = None) -> None:
        self.sock, self.until = sock, until

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        wait = None if self.until is None else max(0, int((self.until - time.monotonic()) * 1000))
        poller = select.poll()  # not select(): after the fd limit is raised, descriptors pass 1024
        poller.register(self.sock, select.POLLIN)
        if not poller.poll(wait):
            raise TimeoutError("the client did not send its message in time")
        return self.sock.recv_into(buffer)


class Lines:
    """Request lines off a connection: the first byte of each as long as `wait_s` allows (None: for ever),
    then the whole line, at most `limit` bytes, within `line_s` of it."""

    def __init__(self, sock: socket.socket, *, line_s: float, limit: int) -> None:
        self._stream = DeadlineStream(sock)
        self._buffer = io.BufferedReader(self._stream, 65536)
        self.line_s, self.limit = line_s, limit

    def readline(self, wait_s: float | None) -> bytes:
        """The next line, at most `limit` bytes (one cut there has no newline), or b"" at the end of the stream."""
        self._stream.until = None if wait_s is None else time.monotonic() + wait_s
        if not self._buffer.peek(1):
            return b""
        self._stream.until = time.monotonic() + self.line_s
        return self._buffer.readline(self.limit)

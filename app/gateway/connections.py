"""Every client connection of the gateway, counted and timed: what aiohttp does not bound by itself.

aiohttp waits for a request's head as long as a client likes and counts no connections, so a stranger's idle or
slow sockets (no byte, half a head) could hold every file the gateway has. Each connection is wrapped (Watched)
as it is accepted:
- in all and per client address there is a cap; a newcomer over one closes the oldest connection that has no
  request in progress (idle between requests, or still sending its head), else it gets a 503 and is closed;
- a connection must finish a request's head within head_timeout_s of its start (or of its first byte after an
  answer), and may sit idle between requests for idle_timeout_s; then it is cut;
- a request in progress (its head read, the gateway's middleware marks it busy) is neither timed nor evicted
  here: its body has body_timeout_s (app.gateway.server), and its answer is the upstream's.
Everything runs on the gateway's event loop: no locks.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable

FD_RESERVE = 64  # files kept beside the connections: the service's socket, the listener, the log, DNS, Python's own
BACKLOG = 128  # the listener's backlog, and so what asyncio accepts at once before a cap is applied
REFUSAL = json.dumps({"error": {"message": "the gateway has too many connections; try again shortly",
                                "type": "server_error", "code": "too_many_connections"}}).encode()
BUSY_ANSWER = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
               b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(REFUSAL)) + REFUSAL


def connection_cap(wanted: int, open_files: int) -> int:
    """[gateway] max_connections, lowered to what the open-file limit holds: each client connection may hold one
    upstream connection too; FD_RESERVE stays free for the rest, and twice BACKLOG for a burst of newcomers
    (accepted before the cap is applied, and those they push out, closed on the loop's next turn)."""
    return max(1, min(wanted, (open_files - FD_RESERVE - 2 * BACKLOG) // 2))


class Connections:
    """The caps and the clocks (module docstring); `wrap` makes the protocol factory that the listener uses."""

    def __init__(self, cap: int, per_address: int, head_s: float, idle_s: float) -> None:
        self.cap, self.per_address, self.head_s, self.idle_s = cap, per_address, head_s, idle_s
        self.open: set[Watched] = set()
        self.idle: dict[Watched, None] = {}  # no request in progress, oldest first: the ones a newcomer may close
        self.by_address: Counter[str] = Counter()
        self.refused = self.cut = 0  # since start, for the tests and the log

    def wrap(self, make: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: Watched(self, make)

    def admit(self, conn: Watched) -> bool:
        """Count `conn` in, making room by closing an idle one where a cap is reached; False: no room."""
        if self.by_address[conn.address] >= self.per_address and not self._evict(conn.address):
            return False
        if len(self.open) >= self.cap and not self._evict(None):
            return False
        self.open.add(conn)
        self.by_address[conn.address] += 1
        return True

    def _evict(self, address: str | None) -> bool:
        oldest = next((c for c in self.idle if address is None or c.address == address), None)
        if oldest is None:
            return False
        self.cut += 1
        oldest.close()  # counted out at once, not when the transport reports the loss
        return True

    def leave(self, conn: Watched) -> None:
        if conn in self.open:
            self.open.discard(conn)
            self.idle.pop(conn, None)
            self.by_address[conn.address] -= 1
            if not self.by_address[conn.address]:
                del self.by_address[conn.address]

    def busy(self, transport: asyncio.BaseTransport | None) -> None:
        """A request's head is read (the middleware has it): no clock and no eviction until its answer is sent."""
        conn = transport.get_protocol() if transport is not None else None
        if isinstance(conn, Watched) and conn in self.open:
            self.idle.pop(conn, None)
            conn.clock(None)

    def done(self, transport: asyncio.BaseTransport | None) -> None:
        """The request was answered: the connection idles (keep-alive) until its next request's first byte."""
        conn = transport.get_protocol() if transport is not None else None
        if isinstance(conn, Watched) and conn in self.open:
            self.idle[conn] = None
            conn.heading = False
            conn.clock(self.idle_s)


class Watched(asyncio.Protocol):
    """One client connection: aiohttp's own protocol inside, with its count and its clock outside."""

    def __init__(self, connections: Connections, make: Callable[[], asyncio.Protocol]) -> None:
        self.connections, self.make = connections, make
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.heading = True  # the head of a request is being sent: the head clock runs, not the idle one
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.address = peer[0] if isinstance(peer, tuple) else str(peer)
        if not self.connections.admit(self):
            self.connections.refused += 1
            transport.write(BUSY_ANSWER)
            transport.close()
            return
        self.connections.idle[self] = None  # until its head is read
        self.clock(self.connections.head_s)
        self.inner = self.make()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if not self.heading and self in self.connections.idle:  # the next request begins: its head has head_s
            self.heading = True
            self.clock(self.connections.head_s)
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc) -> None:
        self.clock(None)
        self.connections.leave(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def clock(self, seconds: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if seconds is None else asyncio.get_running_loop().call_later(seconds, self._expired)

    def _expired(self) -> None:
        self.connections.cut += 1
        self.close()

    def close(self) -> None:
        self.clock(None)
        self.connections.leave(self)
        if self.transport is not None:
            self.transport.abort()

"""What a handler behind the socket gets of the running agent: its service, database thread and replies (each
module logs to its own logger: app.cli.logs).

app.service.door.server.ServiceServer is the one agent; it imports the handlers (enforcement, registrations,
planned starts) and hands itself to them, and they know it only by this surface, so no import runs back to the door.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    import socket

    from app.alerts.engine import Engine
    from app.errors import BoardError
    from app.service import Service


class Runs(Protocol):
    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(*args)` on the database thread, after everything queued before it."""
        ...


class Agent(Protocol):
    started_told_until: float | None  # bookings that started by then have been announced (app.service.box.enforce)
    idle_told: dict[int, tuple[float, float]]  # booking id -> (idle since, released at): told (app.service.box.idle)

    @property
    def service(self) -> Service: ...

    @property
    def database(self) -> Runs: ...

    @property
    def alerts(self) -> Engine: ...

    def reply(self, conn: socket.socket, request_id: Any, result: Any = None, error: BoardError | None = None) -> None:
        """One answer on `conn` to the request `request_id`: `result`, or `error` (its code and message)."""
        ...

"""What the screens ask of the core, as awaitables: every call runs on the database thread.

Screens never hold a connection or a BookingService. They call these methods, which build a
BookingService (app.core.bookings) on the database thread with the newest card list, and
raise the core's errors (BadInput, Conflict, NotPermitted) whose str() is the line to show.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Callable, Sequence

from app.config import Config
from app.core.bookings import BookingService, Plan
from app.model import Booking
from app.core.identity import Identity
from app.gpu.model import FleetSnapshot
from app.store import bookings as rows
from app.store import events
from app.store.events import Event
from app.tui.database import ActionDatabase


@dataclass(frozen=True, slots=True)
class BookingRequest:
    """A parsed booking form: explicit cards or a count, and a half-open [start, end)."""

    cards: tuple[int, ...] | None
    count: int | None
    start: int
    end: int
    klass: str
    note: str = ""


class Backend:
    def __init__(
        self,
        database: ActionDatabase,
        identity: Identity,
        config: Config,
        clock: Callable[[], float],
        fleet: Callable[[], FleetSnapshot | None],
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.database, self.identity, self.config, self.clock = database, identity, config, clock
        self._fleet = fleet
        self._on_change = on_change  # wakes the bookings poller after a write

    def _service(self, conn: sqlite3.Connection) -> BookingService:
        snapshot = self._fleet()
        cards = snapshot.cards if snapshot else ()
        topology = snapshot.topology if snapshot else None
        if topology is None:
            from app.gpu.model import Topology

            topology = Topology()
        return BookingService(conn, self.identity, self.config, cards, topology, self.clock)

    async def _change(self, fn: Callable[[BookingService], Booking]) -> Booking:
        try:
            return await self.database.call(lambda conn: fn(self._service(conn)))
        finally:
            self._on_change()

    # -- bookings ------------------------------------------------------------------------------

    async def plan(self, request: BookingRequest) -> Plan:
        return await self.database.call(lambda conn: self._service(conn).plan(
            cards=request.cards, count=request.count, start=request.start, end=request.end, klass=request.klass))

    async def create(self, request: BookingRequest) -> Booking:
        """Check, then book; a request that fails the check writes nothing at all."""

        def book(service: BookingService) -> Booking:
            service.plan(cards=request.cards, count=request.count, start=request.start, end=request.end,
                         klass=request.klass)
            return service.create(cards=request.cards, count=request.count, start=request.start, end=request.end,
                                  klass=request.klass, note=request.note)

        return await self._change(book)

    async def next_free(self, request: BookingRequest) -> tuple[tuple[int, ...], int]:
        """The earliest (cards, start) at or after the request's start that fits its duration."""

        def find(conn: sqlite3.Connection) -> tuple[tuple[int, ...], int]:
            service = self._service(conn)
            duration = request.end - request.start
            if request.cards is not None:
                return tuple(sorted(set(request.cards))), service.next_free(request.cards, request.start, duration)
            plan = service.plan(count=request.count, start=request.start, end=request.end, klass=request.klass)
            return plan.cards, plan.start

        return await self.database.call(find)

    async def cancel(self, booking_id: int) -> Booking:
        return await self._change(lambda service: service.cancel(booking_id))

    async def release(self, booking_id: int) -> Booking:
        return await self._change(lambda service: service.release(booking_id))

    async def extend(self, booking_id: int, end: int) -> Booking:
        return await self._change(lambda service: service.extend(booking_id, end))

    async def reassign(self, booking_id: int, *, cards: Sequence[int] | None = None, user: str | None = None) -> Booking:
        return await self._change(lambda service: service.reassign(booking_id, cards=cards, user=user))

    # -- lists ---------------------------------------------------------------------------------

    async def all_bookings(self, since: int) -> list[Booking]:
        """Every booking (cancelled too) that ends after `since`: the admin list."""
        return await self.database.call(
            lambda conn: rows.listing(conn, start=since, end=None, user=None, include_cancelled=True))

    async def audit_log(self, limit: int = 200) -> list[Event]:
        return await self.database.call(lambda conn: events.recent(conn, limit))

"""What the screens ask of the service, as awaitables: every call runs on one worker thread.

Screens never hold a connection or a rule object. They call these methods, which send the
operation through the client (in-process or over the socket, the screens cannot tell) and
raise the service's errors (BadInput, Conflict, NotPermitted) whose str() is the line to show.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

from app.model import Booking, Event, booking_from_wire


@dataclass(frozen=True, slots=True)
class BookingRequest:
    """A parsed booking form: explicit cards or a count, and a half-open [start, end)."""

    cards: tuple[int, ...] | None
    count: int | None
    start: int
    end: int
    klass: str
    note: str = ""

    def args(self) -> dict[str, Any]:
        return {"cards": list(self.cards) if self.cards is not None else None, "count": self.count,
                "start": self.start, "end": self.end, "class": self.klass}


@dataclass(frozen=True, slots=True)
class Plan:
    cards: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Booked:
    """A new booking, and the service's notes on what runs on its cards now (cards passed over, or
    another user's processes on a named card): one line each, other users' names in them."""

    booking: Booking
    notes: tuple[str, ...] = ()


class Backend:
    def __init__(self, client, clock: Callable[[], float], on_change: Callable[[], None] = lambda: None) -> None:
        self.client, self.clock = client, clock
        self._on_change = on_change  # reloads the bookings at once after one of our own writes
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="board-calls")

    async def call(self, op: str, **args: Any) -> Any:
        """One operation off the UI thread; the service's error comes back to the caller."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(self.client.call, op, **args))

    async def _write(self, op: str, **args: Any) -> dict[str, Any]:
        try:
            return await self.call(op, **args)
        finally:
            self._on_change()

    async def _change(self, op: str, **args: Any) -> Booking:
        return booking_from_wire(await self._write(op, **args))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- bookings ------------------------------------------------------------------------------

    async def plan(self, request: BookingRequest) -> Plan:
        found = await self.call("plan", **request.args())
        return Plan(tuple(found["cards"]), found["start"], found["end"])

    async def create(self, request: BookingRequest) -> Booked:
        """Check, then book; a request that fails the check writes nothing at all."""
        found = await self._write("book", **request.args(), note=request.note, checked=True)
        return Booked(booking_from_wire(found), tuple(found.get("notes", ())))

    async def next_free(self, request: BookingRequest) -> tuple[tuple[int, ...], int]:
        """The earliest (cards, start) at or after the request's start that fits its duration."""
        found = await self.call("next_free", **request.args())
        return tuple(found["cards"]), found["start"]

    async def cancel(self, booking_id: int) -> Booking:
        return await self._change("cancel", id=booking_id)

    async def release(self, booking_id: int) -> Booking:
        return await self._change("release", id=booking_id)

    async def extend(self, booking_id: int, end: int) -> Booking:
        return await self._change("extend", id=booking_id, end=end)

    async def reassign(self, booking_id: int, *, cards: Sequence[int] | None = None, user: str | None = None) -> Booking:
        return await self._change("reassign", id=booking_id, cards=list(cards) if cards is not None else None, user=user)

    # -- lists ---------------------------------------------------------------------------------

    async def all_bookings(self, since: int) -> list[Booking]:
        """Every booking (cancelled too) that ends after `since`: the admin list."""
        return [booking_from_wire(b) for b in await self.call("all_bookings", since=since)]

    async def audit_log(self, limit: int = 200) -> list[Event]:
        return [Event(**e) for e in await self.call("log", limit=limit)]

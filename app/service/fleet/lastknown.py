"""What the service last read of the bookings, for while its PostgreSQL database is unreachable.

Writes then refuse in one line (app.store.pg.StoreUnreachable); reads of this host answer from here, marked
`stale_since` (the time of that read): `status`, `list`, the board's `window` and its `fleet` event. The agent's
heartbeat refreshes it every second (`remember`: it reads the bookings again only when the audit chain's tail moved,
since every change to a booking is audited), and so does every read that reached the database. Other hosts' cards
are left out of a stale answer: what their services last published cannot be told from a host that went down. `list`
answers from the live bookings kept; what it may ask beyond them (cancelled ones, the past before that read) is
refused in one line naming the filter (`listing`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable

from app.core.identity import lookup_user
from app.core.text import stamp_time
from app.errors import BadInput, BoardError
from app.model import Booking

if TYPE_CHECKING:
    from app.service import Service

FOREVER = 2**62


@dataclass(frozen=True, slots=True)
class Known:
    """The live bookings ending after `read_at`, and those of the last board window read (its past included).
    Replaced whole, so that another thread reads one consistent read."""

    read_at: float | None = None  # None: nothing read yet
    live: tuple[Booking, ...] = ()
    window: tuple[Booking, ...] = ()
    tail: int | None = None  # the audit chain's last event id when `live` was read (None: not known)

    def between(self, start: int, end: int) -> list[Booking]:
        """The known bookings overlapping [start, end), oldest start first (as app.store.bookings.live_between)."""
        found = {b.id: b for b in (*self.window, *self.live) if b.end > start and b.start < end}
        return sorted(found.values(), key=lambda b: (b.start, b.id))


def unreachable(error: BaseException) -> bool:
    """Whether `error` says the PostgreSQL database did not answer (as opposed to refusing, or a rule)."""
    pg = sys.modules.get("app.store.pg")  # not loaded: not a PostgreSQL store (and a SQLite command stays quick)
    return pg is not None and isinstance(error, pg.StoreUnreachable)


def read_live(service: Service, now: float) -> tuple[list[Booking], float | None]:
    """(The live bookings from `now` on, None) from the database, remembered; while it is unreachable, (the last
    ones known, the time they were read). Raises the database's error where nothing is known yet."""
    from app.store import bookings as rows  # start-up: app.service loads it already

    try:
        live = rows.live_between(service.conn, int(now), FOREVER)
    except BoardError as error:
        if not unreachable(error) or service.known.read_at is None:
            raise
        known = service.known
        return [b for b in known.live if b.end > now], known.read_at
    service.known = Known(now, tuple(live), service.known.window)
    return live, None


def listing(service: Service, error: BoardError, *, start: int | None, end: int | None, user: str | None,
            include_cancelled: bool) -> tuple[list[Booking], float]:
    """`list` while the database is unreachable (`error` says so): (this host's live bookings as last read that overlap
    [start, end), of `user` if given, the time they were read). Refuses, in `error`'s line, what is not kept: cancelled
    ones (--all) and the past before that read (--from earlier, or none); raises `error` where nothing is known yet."""
    known = service.known
    if known.read_at is None:
        raise error
    said = str(error).removesuffix("; nothing was changed")
    if include_cancelled:
        raise BoardError(f"{said}; --all needs past and cancelled bookings, which only the database keeps")
    if start is None or start < int(known.read_at):  # (ends are whole seconds: those after read_at are all kept)
        raise BoardError(f"{said}; --from before {stamp_time(known.read_at, service.clock())} needs past bookings,"
                         " which only the database keeps")
    mine = [b for b in known.live if b.host == service.host]
    if user is not None and lookup_user(user) is None and not any(b.user == user for b in mine):
        raise BadInput(f"no user {user!r} on this server")
    found = [b for b in mine if b.end > start and (end is None or b.start < end) and user in (None, b.user)]
    return sorted(found, key=lambda b: (b.start, b.id)), known.read_at


def remember_window(service: Service, now: float, live: Iterable[Booking], window: Iterable[Booking]) -> None:
    service.known = Known(now, tuple(live), tuple(window))


def remember(service: Service) -> None:
    """The heartbeat's refresh (PostgreSQL only: a SQLite file does not go away). The chain's tail is read first, so
    a change that lands between the two reads is read again at the next beat rather than missed."""
    from app.store import events  # start-up: app.service loads it already
    from app.store.db import is_postgres

    if not is_postgres(service.conn):
        return
    now, tail, known = service.clock(), events.tail(service.conn), service.known
    if known.read_at is not None and known.tail == tail:  # nothing changed: the same bookings, as of now
        service.known = replace(known, read_at=now)
    else:
        read_live(service, now)
        service.known = replace(service.known, tail=tail)

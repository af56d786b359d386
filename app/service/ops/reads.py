"""The operations that read: who am I, the fleet and its history, the status, the bookings, the audit log, the report."""

from __future__ import annotations

import resource
from typing import TYPE_CHECKING, Any, TypedDict

from app.core.identity import Identity, lookup_user
from app.errors import BadInput, BoardError
from app.gpu.model import WireSnapshot, snapshot_to_wire
from app.model import Booking, BookingWire, booking_to_wire
from app.service.fleet.lastknown import listing as known_listing
from app.service.fleet.lastknown import read_live, remember_window, unreachable
from app.service.ops.registry import ById, Int, NoArguments, Request, Span, Time, op
from app.service.fleet.status import status_document
from app.store import bookings as rows
from app.store import events

if TYPE_CHECKING:
    from app.service import Service


# -- who and what -------------------------------------------------------------------------------


class Whoami(TypedDict):
    user: str
    uid: int
    admin: bool
    admin_group: str
    transport: str
    db: str | None  # the file, in process only: the socket never shows where it is


@op("whoami", NoArguments)
def whoami(service: Service, me: Identity, request: NoArguments) -> Whoami:
    return {"user": me.name, "uid": me.uid, "admin": me.is_admin, "admin_group": service.config.admin_group,
            "transport": service.transport,
            "db": str(service.config.db_path) if service.transport == "local" else None}


class Stats(TypedDict):
    fleet_reads: int
    subscribers: int
    registered: int
    max_rss_kib: int
    versions: dict[str, int]


@op("stats", NoArguments)
def stats(service: Service, me: Identity, request: NoArguments) -> Stats:
    """How the service is doing: GPU reads so far, subscribers, registered processes, its memory (for benchmarks)."""
    return {
        "fleet_reads": service.fleet.reads,
        "subscribers": service.hub.count,
        "registered": len(service.processes.live()),
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "versions": dict(service.hub.versions),
    }


@op("fleet", NoArguments)
def fleet(service: Service, me: Identity, request: NoArguments) -> WireSnapshot:
    return snapshot_to_wire(service.fleet_snapshot())


class History(Request, frozen=True):
    seconds: Span
    step: Span | None = None
    uuid: str | None = None


@op("history", History)
def history(service: Service, me: Identity, request: History) -> dict[str, list]:
    """Per card uuid (or the one asked for), [taken_at, VRAM GiB, util %, temp °C, power W] every `step` seconds
    over the last `seconds`, oldest first: the service's recorded history (app.history.reply)."""
    from app.history.reply import history_reply  # start-up: only this operation loads the history reader

    return history_reply(service.history, service.fleet, request.seconds, request.step, request.uuid)


class Report(Request, frozen=True):
    since_s: Span
    by: str = "user"


@op("report", Report)
def report(service: Service, me: Identity, request: Report) -> dict[str, Any]:
    """Booked GPU-hours against used ones per user, class, pool or card, and the seeds' verdicts (app.report)."""
    from app.report.gather import report_reply  # start-up: only this operation loads the report

    return report_reply(service.conn, service.history, service.config, service.fleet.latest().cards, service.clock(),
                        request.since_s, request.by)


@op("status", NoArguments)
def status(service: Service, me: Identity, request: NoArguments) -> dict[str, Any]:
    """Every card with its state, current and next booking: the `board status --json` document, in epochs."""
    return status_document(service)


class Got(BookingWire, total=False):
    place: str  # a waiting booking's place in its queue and why ("2nd of 3 in the batch queue: ..."): wait, list


def placed(booking: Booking, places: dict[int, str]) -> Got:
    got: Got = {**booking_to_wire(booking)}
    if booking.id in places:
        got["place"] = places[booking.id]
    return got


@op("get", ById)
def get(service: Service, me: Identity, request: ById) -> Got:
    rules = service.bookings(me)
    booking = rules.get(request.id)
    return placed(booking, rules.queue_places([booking]))


class Listing(Request, frozen=True):
    """Those overlapping [start, end) (no start: the past too), of `user` (`mine`: the caller), cancelled ones too
    with `include_cancelled`."""
    start: Time | None = None
    end: Time | None = None
    user: str | None = None
    mine: bool = False
    include_cancelled: bool = False


class Listed(TypedDict, total=False):
    bookings: list[Got]
    stale_since: float  # only while a PostgreSQL database is unreachable: when the bookings were last read


@op("list", Listing)
def listing(service: Service, me: Identity, request: Listing) -> Listed:
    """`{"bookings": [...]}`: those the request asks for; while a PostgreSQL database is unreachable, this host's as
    last read, with `stale_since` (app.service.fleet.lastknown.listing)."""
    start, end, include_cancelled = request.start, request.end, request.include_cancelled
    user = me.name if request.mine else request.user
    try:
        if user is not None and lookup_user(user) is None and not rows.listing(
                service.conn, start=None, end=None, user=user, include_cancelled=True):
            raise BadInput(f"no user {user!r} on this server")
        found = rows.listing(service.conn, start=start, end=end, user=user, include_cancelled=include_cancelled)
    except BoardError as error:
        if not unreachable(error):
            raise
        found, stale_since = known_listing(service, error, start=start, end=end, user=user,
                                           include_cancelled=include_cancelled)
        return {"bookings": [placed(b, {}) for b in found], "stale_since": stale_since}
    places = service.bookings(me).queue_places(found) if any(b.queued for b in found) else {}
    return {"bookings": [placed(b, places) for b in found]}


class Window(Request, frozen=True):
    start: Time
    end: Time


class Drawn(TypedDict, total=False):
    version: int
    now: float
    upcoming: list[BookingWire]
    in_window: list[BookingWire]
    stale_since: float  # only while a PostgreSQL database is unreachable


@op("window", Window)
def window(service: Service, me: Identity, request: Window) -> Drawn:
    """What the board draws: bookings from now on, and those in the timeline's window; while a PostgreSQL database is
    unreachable, as last read, with `stale_since`."""
    now = service.clock()
    version = service.hub.versions["bookings"]
    upcoming, stale_since = read_live(service, now)
    if stale_since is not None:  # the database away: the bookings as last read (app.service.fleet.lastknown)
        return {"version": version, "now": now, "upcoming": [booking_to_wire(b) for b in upcoming],
                "in_window": [booking_to_wire(b) for b in service.known.between(request.start, request.end)],
                "stale_since": stale_since}
    in_window = rows.live_between(service.conn, request.start, request.end)
    remember_window(service, now, upcoming, in_window)
    return {"version": version, "now": now, "upcoming": [booking_to_wire(b) for b in upcoming],
            "in_window": [booking_to_wire(b) for b in in_window]}


class Since(Request, frozen=True):
    since: Time


@op("all_bookings", Since)
def all_bookings(service: Service, me: Identity, request: Since) -> list[BookingWire]:
    return [booking_to_wire(b) for b in rows.listing(service.conn, start=request.since, end=None, user=None,
                                                     include_cancelled=True)]


# -- audit --------------------------------------------------------------------------------------


class Log(Request, frozen=True):
    limit: Int = 50
    booking: Int | None = None


# An audit event on the wire: app.model.Event's fields (functional form, as app.model.BookingWire).
EventWire = TypedDict("EventWire", {"id": int, "ts": int, "uid": int, "actor": str, "action": str,
                                    "booking_id": int | None, "ok": bool, "details": dict[str, Any]})


@op("log", Log)
def log(service: Service, me: Identity, request: Log) -> list[EventWire]:
    if not 0 < request.limit <= 1_000_000:
        raise BadInput(f"{request.limit} is not a count from 1 to 1000000")
    return [{"id": e.id, "ts": e.ts, "uid": e.uid, "actor": e.actor, "action": e.action, "booking_id": e.booking_id,
             "ok": e.ok, "details": e.details}
            for e in events.recent(service.conn, limit=request.limit, booking_id=request.booking)]

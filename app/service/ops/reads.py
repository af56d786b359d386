"""The operations that read: who am I, the fleet and its history, the status, the bookings, the audit log, the report."""

from __future__ import annotations

import resource
from typing import TYPE_CHECKING

from app.core.identity import Identity, lookup_user
from app.errors import BadInput, BoardError
from app.gpu.model import snapshot_to_wire
from app.model import booking_to_wire
from app.service.ops.registry import BOOL, INT, SPAN, STR, TIME, op
from app.service.fleet.lastknown import listing as known_listing
from app.service.fleet.lastknown import read_live, remember_window, unreachable
from app.service.fleet.status import status_document
from app.store import bookings as rows
from app.store import events

if TYPE_CHECKING:
    from app.service import Service


# -- who and what -------------------------------------------------------------------------------


@op("whoami")
def whoami(service: Service, me: Identity) -> dict:
    return {"user": me.name, "uid": me.uid, "admin": me.is_admin, "admin_group": service.config.admin_group,
            "transport": service.transport,
            "db": str(service.config.db_path) if service.transport == "local" else None}


@op("stats")
def stats(service: Service, me: Identity) -> dict:
    """How the service is doing: GPU reads so far, subscribers, registered processes, its memory (for benchmarks)."""
    return {
        "fleet_reads": service.fleet.reads,
        "subscribers": service.hub.count,
        "registered": len(service.processes.live()),
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "versions": dict(service.hub.versions),
    }


@op("fleet")
def fleet(service: Service, me: Identity) -> dict:
    return snapshot_to_wire(service.fleet_snapshot())


@op("history", {"seconds": SPAN}, {"step": SPAN, "uuid": STR})
def history(service: Service, me: Identity, seconds: int, step: int | None = None, uuid: str | None = None) -> dict:
    """Per card uuid (or the one asked for), [taken_at, VRAM GiB, util %, temp °C, power W] every `step` seconds
    over the last `seconds`, oldest first: the service's recorded history (app.history.reply)."""
    from app.history.reply import history_reply  # start-up: only this operation loads the history reader

    return history_reply(service.history, service.fleet, seconds, step, uuid)


@op("report", {"since_s": SPAN}, {"by": STR})
def report(service: Service, me: Identity, since_s: int, by: str = "user") -> dict:
    """Booked GPU-hours against used ones per user, class, pool or card, and the seeds' verdicts (app.report)."""
    from app.report.gather import report_reply  # start-up: only this operation loads the report

    return report_reply(service.conn, service.history, service.config, service.fleet.latest().cards, service.clock(),
                        since_s, by)


@op("status")
def status(service: Service, me: Identity) -> dict:
    """Every card with its state, current and next booking: the `board status --json` document, in epochs."""
    return status_document(service)


@op("get", {"id": INT})
def get(service: Service, me: Identity, id: int) -> dict:
    return booking_to_wire(service.bookings(me).get(id))


@op("list", {}, {"start": TIME, "end": TIME, "user": STR, "mine": BOOL, "include_cancelled": BOOL})
def listing(service: Service, me: Identity, start=None, end=None, user=None, mine=False, include_cancelled=False) -> dict:
    """`{"bookings": [...]}`: those overlapping [start, end) (no start: the past too), of `user`, cancelled ones too
    with `include_cancelled`; while a PostgreSQL database is unreachable, this host's as last read, with
    `stale_since` (app.service.fleet.lastknown.listing)."""
    if mine:
        user = me.name
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
        return {"bookings": [booking_to_wire(b) for b in found], "stale_since": stale_since}
    return {"bookings": [booking_to_wire(b) for b in found]}


@op("window", {"start": TIME, "end": TIME})
def window(service: Service, me: Identity, start: int, end: int) -> dict:
    """What the board draws: bookings from now on, and those in the timeline's window; while a PostgreSQL database is
    unreachable, as last read, with `stale_since`."""
    now = service.clock()
    version = service.hub.versions["bookings"]
    upcoming, stale_since = read_live(service, now)
    if stale_since is not None:  # the database away: the bookings as last read (app.service.fleet.lastknown)
        return {"version": version, "now": now, "upcoming": [booking_to_wire(b) for b in upcoming],
                "in_window": [booking_to_wire(b) for b in service.known.between(start, end)],
                "stale_since": stale_since}
    in_window = rows.live_between(service.conn, start, end)
    remember_window(service, now, upcoming, in_window)
    return {"version": version, "now": now, "upcoming": [booking_to_wire(b) for b in upcoming],
            "in_window": [booking_to_wire(b) for b in in_window]}


@op("all_bookings", {"since": TIME})
def all_bookings(service: Service, me: Identity, since: int) -> list:
    return [booking_to_wire(b) for b in rows.listing(service.conn, start=since, end=None, user=None, include_cancelled=True)]


# -- audit --------------------------------------------------------------------------------------


@op("log", {}, {"limit": INT, "booking": INT})
def log(service: Service, me: Identity, limit=50, booking=None) -> list:
    if not 0 < limit <= 1_000_000:
        raise BadInput(f"{limit} is not a count from 1 to 1000000")
    return [{"id": e.id, "ts": e.ts, "uid": e.uid, "actor": e.actor, "action": e.action, "booking_id": e.booking_id,
             "ok": e.ok, "details": e.details} for e in events.recent(service.conn, limit=limit, booking_id=booking)]

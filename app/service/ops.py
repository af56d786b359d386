"""The operations: one table, one entry each (name, arguments, handler, whether it writes).

The CLI's commands and the TUI's actions map onto these names, so a feature is added once.
A handler gets the Service, the caller's Identity and the checked arguments, and returns JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from app.core.identity import Identity, lookup_user
from app.errors import BadInput, Conflict
from app.model import Booking, booking_to_wire

INT, STR, BOOL, LIST, DICT = int, str, bool, list, dict
FOREVER = 2**62


@dataclass(frozen=True)
class Whole:
    """An integer argument in [low, high]: times and spans stay where dates, the rules and SQLite can take them."""
    low: int
    high: int
    what: str
    __name__ = "int"


# Python's dates end with the year 9999: a time up to 9000, plus a span (extend) or the rules' reach, stays a date.
TIME = Whole(0, 221845392000, "a time from 1970 to 9000 (epoch seconds)")  # 9000-01-01 UTC
SPAN = Whole(-28401840000, 28401840000, "a span of at most 900 years (seconds)")


@dataclass(frozen=True)
class Op:
    name: str
    handler: Callable[..., Any]
    required: dict[str, type]
    optional: dict[str, type]
    writes: bool = False  # changes bookings: subscribers reload them
    frees: bool = False  # may free time, so queued bookings move up after it (Service.backfill)

    def check(self, args: Any) -> dict[str, Any]:
        """The arguments as keywords; a missing, unknown or mistyped one is BadInput (exit 2)."""
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise BadInput(f"{self.name}: the arguments must be a JSON object")
        for name in self.required:
            if args.get(name) is None:
                raise BadInput(f"{self.name}: missing argument {name!r}")
        known = {**self.required, **self.optional}
        for name, value in args.items():
            if name not in known:
                raise BadInput(f"{self.name}: unknown argument {str(name)[:40]!r}")
            kind = known[name]
            whole = kind is INT or isinstance(kind, Whole)
            if value is not None and (not isinstance(value, int if whole else kind) or (whole and isinstance(value, bool))):
                raise BadInput(f"{self.name}: argument {name!r} must be {kind.__name__}")
            if kind is INT and value is not None and not -(2**63) < value < 2**63:
                raise BadInput(f"{self.name}: argument {name!r} is out of range")
            if isinstance(kind, Whole) and value is not None and not kind.low <= value <= kind.high:
                raise BadInput(f"{self.name}: argument {name!r} must be {kind.what}")
        return {k: v for k, v in args.items() if v is not None}


OPS: dict[str, Op] = {}


def op(name: str, required: dict[str, type] | None = None, optional: dict[str, type] | None = None, writes=False,
       frees=False):
    def register(handler):
        OPS[name] = Op(name, handler, required or {}, optional or {}, writes or frees, frees)
        return handler

    return register


def wire(booking: Booking) -> dict[str, Any]:
    return booking_to_wire(booking)


def _cards(value: list | None) -> list[int] | None:
    if value is None:
        return None
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in value):
        raise BadInput("cards must be a list of card numbers")
    return value


# -- who and what -------------------------------------------------------------------------------


@op("whoami")
def whoami(service, me: Identity) -> dict:
    return {"user": me.name, "uid": me.uid, "admin": me.is_admin, "admin_group": service.config.admin_group,
            "transport": service.transport,
            "db": str(service.config.db_path) if service.transport == "local" else None}


@op("stats")
def stats(service, me: Identity) -> dict:
    """How the service is doing: GPU reads so far, subscribers, registered processes, its memory (for benchmarks)."""
    import resource

    return {
        "fleet_reads": service.fleet.reads,
        "subscribers": service.hub.count,
        "registered": len(service.processes.live()),
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "versions": dict(service.hub.versions),
    }


@op("fleet")
def fleet(service, me: Identity) -> dict:
    from app.gpu.model import snapshot_to_wire

    return snapshot_to_wire(service.fleet.latest())


@op("history", {"seconds": SPAN}, {"step": SPAN, "uuid": STR})
def history(service, me: Identity, seconds: int, step: int | None = None, uuid: str | None = None) -> dict:
    """Per card uuid (or the one asked for), [taken_at, VRAM GiB, util %, temp °C, power W] every `step` seconds
    over the last `seconds`, oldest first: the service's recorded history (app.history.reply)."""
    from app.history.reply import history_reply

    return history_reply(service, seconds, step, uuid)


@op("report", {"since_s": SPAN}, {"by": STR})
def report(service, me: Identity, since_s: int, by: str = "user") -> dict:
    """Booked GPU-hours against used ones per user, class, pool or card, and the seeds' verdicts (app.report)."""
    from app.report.gather import report_reply

    return report_reply(service, since_s, by)


@op("status")
def status(service, me: Identity) -> dict:
    """Every card with its state, current and next booking: the `board status --json` document, in epochs."""
    from app.core.cardstate import UNKNOWN_USER, fleet_status
    from app.store import bookings as rows

    snapshot = _fleet_with_servers(service)
    now = service.clock()
    live = rows.live_between(service.conn, int(now), FOREVER)
    statuses = fleet_status(snapshot, live, now, hot_celsius=service.config.hot_celsius, labels=service.config.labels)
    cards = []
    for s in statuses:
        r = s.reading
        cards.append({
            "index": r.index, "uuid": r.uuid, "name": r.name, "label": s.label,
            "memory_total_mib": r.memory_total_mib, "memory_used_mib": r.memory_used_mib,
            "utilization_pct": r.utilization_pct, "temperature_c": r.temperature_c, "power_w": r.power_w,
            "power_limit_w": r.power_limit_w, "pci_bus_id": r.pci_bus_id, "state": s.state,
            "warnings": list(s.warnings), "users": list(s.users),
            "booking": wire(s.booking) if s.booking else None,
            "next_booking": wire(s.next_booking) if s.next_booking else None,
            "processes": [{"pid": p.pid, "user": p.user or UNKNOWN_USER, "used_mib": p.used_mib, "command": p.command}
                          for p in r.processes],
        })
    return {"simulated": snapshot.simulated, "taken_at": snapshot.taken_at, "cards": cards}


def _fleet_with_servers(service):
    if service.fleet.simulated:  # demo llama-servers run on the CPU: show them on their booked cards
        from app.llama.processes import feed_simulated

        if feed_simulated(service.fleet.source, service.conn):
            service.fleet.invalidate()
    return service.fleet.latest()


# -- bookings -----------------------------------------------------------------------------------

_SLOT = {"start": TIME, "end": TIME}
_WHICH = {"cards": LIST, "count": INT, "class": STR}


@op("plan", _SLOT, {**_WHICH, "or_later": BOOL})
def plan(service, me: Identity, start: int, end: int, cards=None, count=None, or_later=False, **rest) -> dict:
    found = service.bookings(me).plan(cards=_cards(cards), count=count, start=start, end=end,
                                      klass=rest.get("class", "experiment"), or_later=or_later)
    return {"cards": list(found.cards), "uuids": list(found.uuids), "start": found.start, "end": found.end,
            "notes": list(found.notes)}


@op("next_free", _SLOT, _WHICH)
def next_free(service, me: Identity, start: int, end: int, cards=None, count=None, **rest) -> dict:
    rules, klass = service.bookings(me), rest.get("class", "experiment")
    if cards is not None:
        chosen = sorted(set(_cards(cards)))
        found = rules.next_free(chosen, start, end - start, klass=klass)
        if found is None:
            raise Conflict(f"no start within {service.config.policy.max_ahead_days:g} days works for cards"
                           f" {','.join(map(str, chosen))}; try other cards or a shorter slot")
        return {"cards": chosen, "start": found}
    found = rules.plan(count=count, start=start, end=end, klass=klass, or_later=True)
    return {"cards": list(found.cards), "start": found.start}


@op("slots", _SLOT, {"count": INT, "class": STR, "limit": INT})
def slots(service, me: Identity, start: int, end: int, count=1, limit=3, **rest) -> dict:
    """Up to `limit` earliest slots on different groups of `count` cards (board fit --for)."""
    if not 1 <= limit <= 10:
        raise BadInput("slots: limit is 1 to 10")
    found = service.bookings(me).options(count, rest.get("class", "experiment"), start, end - start, limit)
    return {"slots": [{"cards": list(p.cards), "start": p.start, "end": p.end, "free_until": until}
                      for p, until in found]}


@op("book", _SLOT, {**_WHICH, "note": STR, "request": DICT, "checked": BOOL, "or_later": BOOL}, writes=True)
def book(service, me: Identity, start: int, end: int, cards=None, count=None, note="", request=None,
         checked=False, or_later=False, **rest) -> dict:
    rules = service.bookings(me)
    klass = rest.get("class", "experiment")
    if cards is None and count is None:
        raise BadInput("say which cards: a count (board book 2) or --cards 0,1")
    if cards is not None and count is not None:
        raise BadInput("give a count or --cards, not both")
    if request is not None:  # every member's `board list` shows it: known keys, each in its type and range
        from app.core.request import check

        request = check(request)
    if checked:  # the form's path: a request that fails the check writes nothing at all, not even an audit row
        rules.plan(cards=_cards(cards), count=count, start=start, end=end, klass=klass, or_later=or_later)
    booking, notes = rules.book(cards=_cards(cards), count=count, start=start, end=end, klass=klass, note=note,
                                request=request, or_later=or_later)
    # "notes", only when there are any: one line each on what runs on the cards now (passed over, or named)
    return {**wire(booking), "notes": list(notes)} if notes else wire(booking)


@op("get", {"id": INT})
def get(service, me: Identity, id: int) -> dict:
    return wire(service.bookings(me).get(id))


@op("list", {}, {"start": TIME, "end": TIME, "user": STR, "mine": BOOL, "include_cancelled": BOOL})
def listing(service, me: Identity, start=None, end=None, user=None, mine=False, include_cancelled=False) -> list:
    from app.store import bookings as rows

    if mine:
        user = me.name
    if user is not None and lookup_user(user) is None and not rows.listing(
            service.conn, start=None, end=None, user=user, include_cancelled=True):
        raise BadInput(f"no user {user!r} on this server")
    found = rows.listing(service.conn, start=start, end=end, user=user, include_cancelled=include_cancelled)
    return [wire(b) for b in found]


@op("window", {"start": TIME, "end": TIME})
def window(service, me: Identity, start: int, end: int) -> dict:
    """What the board draws: bookings from now on, and those in the timeline's window."""
    from app.store import bookings as rows

    now = service.clock()
    return {
        "version": service.hub.versions["bookings"],
        "now": now,
        "upcoming": [wire(b) for b in rows.live_between(service.conn, int(now), FOREVER)],
        "in_window": [wire(b) for b in rows.live_between(service.conn, start, end)],
    }


@op("cancel", {"id": INT}, frees=True)
def cancel(service, me: Identity, id: int) -> dict:
    return wire(service.bookings(me).cancel(id))


@op("release", {"id": INT}, frees=True)
def release(service, me: Identity, id: int) -> dict:
    return wire(service.bookings(me).release(id))


@op("extend", {"id": INT}, {"end": TIME, "add_seconds": SPAN}, writes=True)
def extend(service, me: Identity, id: int, end=None, add_seconds=None) -> dict:
    rules = service.bookings(me)
    if (end is None) == (add_seconds is None):
        raise BadInput("give the new end or how much to add, not both")
    if end is None:
        end = rules.get(id).end + add_seconds
    return wire(rules.extend(id, end))


@op("reassign", {"id": INT}, {"cards": LIST, "user": STR, "force": BOOL}, frees=True)
def reassign(service, me: Identity, id: int, cards=None, user=None, force=False) -> dict:
    if (cards is None) == (user is None):
        raise BadInput("give the new cards or the new user")
    moved = service.bookings(me).reassign(id, cards=_cards(cards), user=user, force=force)
    service.wake_enforcer.set()  # work left on the old cards, or of the old holder, stops now rather than later
    return wire(moved)


@op("move", {"id": INT, "start": TIME, "end": TIME}, {"override_policy": BOOL}, frees=True)
def move(service, me: Identity, id: int, start: int, end: int, override_policy=False) -> dict:
    """An admin gives a booking new times on the same cards; its holder is told."""
    moved = service.bookings(me).move(id, start, end, override_policy=override_policy)
    service.wake_enforcer.set()  # work past the new end stops now rather than at the next pass
    return wire(moved)


@op("all_bookings", {"since": TIME})
def all_bookings(service, me: Identity, since: int) -> list:
    from app.store import bookings as rows

    return [wire(b) for b in rows.listing(service.conn, start=since, end=None, user=None, include_cancelled=True)]


# -- series (standing slots) -------------------------------------------------------------------


def _series(service, me: Identity):
    from app.service.series import SeriesService

    return SeriesService(service.bookings(me))


def _series_wire(series) -> dict:
    return {"id": series.id, "user": series.user, "uid": series.uid, "rule": series.rule, "created_at": series.created_at}


def _outcome_wire(outcome) -> dict:
    return {"series": _series_wire(outcome.series), "bookings": [wire(b) for b in outcome.booked],
            "skipped": [m.to_wire() for m in outcome.skipped], "overridden": [m.to_wire() for m in outcome.overridden]}


def _tell_holder(service, me: Identity, series, what: str) -> None:
    """An admin acting on someone else's series: the holder hears of it in their open boards."""
    if series.uid != me.uid:
        service.hub.publish("notice", {"message": f"your series {series.id} was {what} by {me.name}"}, uid=series.uid)


@op("series_book", {"cards": LIST, "every": STR, "start": STR, "until": STR, "to": STR},
    {"from": STR, "class": STR, "note": STR, "skip_conflicts": BOOL, "override_policy": BOOL}, writes=True)
def series_book(service, me: Identity, cards: list, every: str, start: str, until: str, to: str, note="",
                skip_conflicts=False, override_policy=False, **rest) -> dict:
    """Book a standing slot: every occurrence of the rule, all or nothing (app.service.series)."""
    outcome = _series(service, me).book(
        cards=_cards(cards), every=every, start=start, until=until, first=rest.get("from"), last=to,
        klass=rest.get("class", "experiment"), note=note, skip_conflicts=skip_conflicts,
        override_policy=override_policy)
    return _outcome_wire(outcome)


@op("series_get", {"id": INT})
def series_get(service, me: Identity, id: int) -> dict:
    series, found = _series(service, me).get(id)
    return {"series": _series_wire(series), "bookings": [wire(b) for b in found]}


@op("series_extend", {"id": INT, "to": STR}, {"skip_conflicts": BOOL, "override_policy": BOOL}, writes=True)
def series_extend(service, me: Identity, id: int, to: str, skip_conflicts=False, override_policy=False) -> dict:
    outcome = _series(service, me).extend(id, to, skip_conflicts=skip_conflicts, override_policy=override_policy)
    _tell_holder(service, me, outcome.series, f"extended to {to}")
    return _outcome_wire(outcome)


@op("series_cancel", {"id": INT}, frees=True)
def series_cancel(service, me: Identity, id: int) -> dict:
    series, cancelled, running = _series(service, me).cancel(id)
    _tell_holder(service, me, series, "cancelled")
    return {"series": _series_wire(series), "cancelled": [wire(b) for b in cancelled],
            "running": [wire(b) for b in running]}


# -- audit --------------------------------------------------------------------------------------


@op("log", {}, {"limit": INT, "booking": INT})
def log(service, me: Identity, limit=50, booking=None) -> list:
    from app.store import events

    if not 0 < limit <= 1_000_000:
        raise BadInput(f"{limit} is not a count from 1 to 1000000")
    return [{"id": e.id, "ts": e.ts, "uid": e.uid, "actor": e.actor, "action": e.action, "booking_id": e.booking_id,
             "ok": e.ok, "details": e.details} for e in events.recent(service.conn, limit=limit, booking_id=booking)]


# -- board run ----------------------------------------------------------------------------------


@op("run", {}, {"booking": INT, "waiting": BOOL})
def run(service, me: Identity, booking=None, waiting=False) -> dict:
    """The booking a `board run` job may run under now: the caller's own, active one. Refusals are audited.
    `waiting` (`board run --wait`, before it waits): the caller's own booking, whether or not it has started."""
    from app.service.enforce import run_booking

    if waiting and booking is None:
        raise BadInput("run: waiting needs the booking to wait for")
    return wire(run_booking(service, me, booking, waiting))


from app.service import servers as _servers  # noqa: E402,F401 - registers the `serve_*` operations
from app.service import notify as _notify  # noqa: E402,F401 - registers the `notify_*` operations
from app.service import faults as _faults  # noqa: E402,F401 - registers the `faults` operation
from app.service import alerts as _alerts  # noqa: E402,F401 - registers the `alerts` operation

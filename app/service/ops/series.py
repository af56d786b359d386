"""The standing slots' operations: book a series, look at it, extend it, cancel it (app.service.rules.series)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from app.core.identity import Identity
from app.model import BookingWire, booking_to_wire
from app.service.ops.registry import ById, Int, Request, op

if TYPE_CHECKING:
    from app.service import Service
    from app.service.rules.series import Outcome, SeriesService
    from app.store.series import Series


# -- series (standing slots) -------------------------------------------------------------------


class SeriesWire(TypedDict):
    id: int
    user: str
    uid: int
    rule: dict[str, Any]
    created_at: int


class OutcomeReply(TypedDict):
    series: SeriesWire
    bookings: list[BookingWire]
    skipped: list[dict[str, Any]]  # occurrences passed over, or booked over the policy (app.service.rules.series.Miss)
    overridden: list[dict[str, Any]]


def _series(service: Service, me: Identity, host: str | None = None, series_id: int | None = None) -> SeriesService:
    """The series rules on `host`'s cards (default this host's), or on those of the host series `series_id` is on."""
    from app.service.rules.series import SeriesService  # start-up: booking commands do not load the series rules
    from app.store.series import first_occurrence  # start-up: as above

    booking = first_occurrence(service.conn, series_id) if series_id is not None else None
    return SeriesService(service.bookings(me, host, booking=booking))


def _series_wire(series: Series) -> SeriesWire:
    return {"id": series.id, "user": series.user, "uid": series.uid, "rule": series.rule, "created_at": series.created_at}


def _outcome_wire(outcome: Outcome) -> OutcomeReply:
    return {"series": _series_wire(outcome.series), "bookings": [booking_to_wire(b) for b in outcome.booked],
            "skipped": [m.to_wire() for m in outcome.skipped], "overridden": [m.to_wire() for m in outcome.overridden]}


def _tell_holder(service: Service, me: Identity, series: Series, what: str) -> None:
    """An admin acting on someone else's series: the holder hears of it in their open boards."""
    if series.uid != me.uid:
        service.hub.publish("notice", {"message": f"your series {series.id} was {what} by {me.name}"}, uid=series.uid)


class SeriesBook(Request, frozen=True):
    """Every occurrence of the rule: `every` (a day, weekday, ...), from `start` until `until` (times of day), on
    the days `first` (the wire's `from`; default today) to `to`."""
    cards: list[int]
    every: str
    start: str
    until: str
    to: str
    first: str | None = None
    klass: str = "experiment"
    note: str = ""
    skip_conflicts: bool = False
    override_policy: bool = False
    host: str | None = None  # where the cards are (default this host's)
    project: str | None = None


@op("series_book", SeriesBook)
def series_book(service: Service, me: Identity, request: SeriesBook) -> OutcomeReply:
    """Book a standing slot: every occurrence of the rule, all or nothing (app.service.rules.series)."""
    outcome = _series(service, me, request.host).book(
        cards=request.cards, every=request.every, start=request.start, until=request.until, first=request.first,
        last=request.to, klass=request.klass, note=request.note, skip_conflicts=request.skip_conflicts,
        override_policy=request.override_policy, project=request.project)
    return _outcome_wire(outcome)


class SeriesGot(TypedDict):
    series: SeriesWire
    bookings: list[BookingWire]


@op("series_get", ById)
def series_get(service: Service, me: Identity, request: ById) -> SeriesGot:
    series, found = _series(service, me, series_id=request.id).get(request.id)
    return {"series": _series_wire(series), "bookings": [booking_to_wire(b) for b in found]}


class SeriesExtend(Request, frozen=True):
    id: Int
    to: str
    skip_conflicts: bool = False
    override_policy: bool = False


@op("series_extend", SeriesExtend)
def series_extend(service: Service, me: Identity, request: SeriesExtend) -> OutcomeReply:
    outcome = _series(service, me, series_id=request.id).extend(
        request.id, request.to, skip_conflicts=request.skip_conflicts, override_policy=request.override_policy)
    _tell_holder(service, me, outcome.series, f"extended to {request.to}")
    return _outcome_wire(outcome)


class SeriesCancelled(TypedDict):
    series: SeriesWire
    cancelled: list[BookingWire]
    running: list[BookingWire]


@op("series_cancel", ById)
def series_cancel(service: Service, me: Identity, request: ById) -> SeriesCancelled:
    series, cancelled, running = _series(service, me, series_id=request.id).cancel(request.id)
    _tell_holder(service, me, series, "cancelled")
    return {"series": _series_wire(series), "cancelled": [booking_to_wire(b) for b in cancelled],
            "running": [booking_to_wire(b) for b in running]}

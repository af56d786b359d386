"""The standing slots' operations: book a series, look at it, extend it, cancel it (app.service.rules.series)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.identity import Identity
from app.model import booking_to_wire
from app.service.ops.registry import BOOL, INT, LIST, STR, card_list, op

if TYPE_CHECKING:
    from app.service import Service


# -- series (standing slots) -------------------------------------------------------------------


def _series(service: Service, me: Identity, host: str | None = None, series_id: int | None = None):
    """The series rules on `host`'s cards (default this host's), or on those of the host series `series_id` is on."""
    from app.service.rules.series import SeriesService  # start-up: booking commands do not load the series rules
    from app.store.series import first_occurrence  # start-up: as above

    booking = first_occurrence(service.conn, series_id) if series_id is not None else None
    return SeriesService(service.bookings(me, host, booking=booking))


def _series_wire(series) -> dict:
    return {"id": series.id, "user": series.user, "uid": series.uid, "rule": series.rule, "created_at": series.created_at}


def _outcome_wire(outcome) -> dict:
    return {"series": _series_wire(outcome.series), "bookings": [booking_to_wire(b) for b in outcome.booked],
            "skipped": [m.to_wire() for m in outcome.skipped], "overridden": [m.to_wire() for m in outcome.overridden]}


def _tell_holder(service: Service, me: Identity, series, what: str) -> None:
    """An admin acting on someone else's series: the holder hears of it in their open boards."""
    if series.uid != me.uid:
        service.hub.publish("notice", {"message": f"your series {series.id} was {what} by {me.name}"}, uid=series.uid)


@op("series_book", {"cards": LIST, "every": STR, "start": STR, "until": STR, "to": STR},
    {"from": STR, "class": STR, "note": STR, "skip_conflicts": BOOL, "override_policy": BOOL, "host": STR}, writes=True)
def series_book(service: Service, me: Identity, cards: list, every: str, start: str, until: str, to: str, note="",
                skip_conflicts=False, override_policy=False, **rest) -> dict:
    """Book a standing slot: every occurrence of the rule, all or nothing (app.service.rules.series)."""
    outcome = _series(service, me, rest.get("host")).book(
        cards=card_list(cards), every=every, start=start, until=until, first=rest.get("from"), last=to,
        klass=rest.get("class", "experiment"), note=note, skip_conflicts=skip_conflicts,
        override_policy=override_policy)
    return _outcome_wire(outcome)


@op("series_get", {"id": INT})
def series_get(service: Service, me: Identity, id: int) -> dict:
    series, found = _series(service, me, series_id=id).get(id)
    return {"series": _series_wire(series), "bookings": [booking_to_wire(b) for b in found]}


@op("series_extend", {"id": INT, "to": STR}, {"skip_conflicts": BOOL, "override_policy": BOOL}, writes=True)
def series_extend(service: Service, me: Identity, id: int, to: str, skip_conflicts=False, override_policy=False) -> dict:
    outcome = _series(service, me, series_id=id).extend(id, to, skip_conflicts=skip_conflicts, override_policy=override_policy)
    _tell_holder(service, me, outcome.series, f"extended to {to}")
    return _outcome_wire(outcome)


@op("series_cancel", {"id": INT}, frees=True)
def series_cancel(service: Service, me: Identity, id: int) -> dict:
    series, cancelled, running = _series(service, me, series_id=id).cancel(id)
    _tell_holder(service, me, series, "cancelled")
    return {"series": _series_wire(series), "cancelled": [booking_to_wire(b) for b in cancelled],
            "running": [booking_to_wire(b) for b in running]}

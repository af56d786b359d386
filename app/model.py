"""The entities every layer shares, with no behaviour beyond what they are: a leaf module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict


@dataclass(frozen=True, slots=True)
class Booking:
    id: int
    user: str
    uid: int
    cards: tuple[int, ...]  # NVML indexes, in the same order as card_uuids
    card_uuids: tuple[str, ...]
    start: int  # UTC epoch seconds, half-open [start, end)
    end: int
    klass: str
    note: str
    status: str  # booked | cancelled
    request: dict[str, Any] | None = None
    created_at: int = 0
    requested_at: int = 0  # when the holder wanted the cards from; the wait is start - requested_at
    queued: str | None = None  # may move earlier when time frees up: 'time' (same cards) or 'cards' (any group)
    series_id: int | None = None
    notice: str | None = None  # the latest change someone else made (an admin, the backfill), for the holder
    host: str = ""  # the host its cards are on ([fleet] host); '' before the fleet claimed them
    project: str = ""  # the [[projects]] entry it is for; '' on a board without projects (app.core.projects)

    def active(self, now: float) -> bool:
        return self.status == "booked" and self.start <= now < self.end

    @property
    def on_demand(self) -> str:
        """The catalog alias ([[models]]) an on-demand booking was made for; '' for any other booking. Such a booking
        is the runner account's and yields to every other (app.service.rules.ondemand)."""
        return (self.request or {}).get("on_demand") or ""


@dataclass(frozen=True, slots=True)
class Event:
    """One line of the audit log: who did what to which booking, and whether it was allowed."""

    id: int
    ts: int
    uid: int
    actor: str
    action: str
    booking_id: int | None
    ok: bool
    details: dict[str, Any]


# A booking on the wire: Booking's fields, `klass` as "class", the tuples as lists (functional form: `class` is a
# keyword).
BookingWire = TypedDict("BookingWire", {
    "id": int, "user": str, "uid": int, "cards": list[int], "card_uuids": list[str], "start": int, "end": int,
    "class": str, "note": str, "status": str, "request": dict[str, Any] | None, "created_at": int,
    "requested_at": int, "queued": str | None, "series_id": int | None, "notice": str | None, "host": str,
    "project": NotRequired[str],  # only on a board with [[projects]]: without, the shape is as it always was
})


def booking_to_wire(booking: Booking) -> BookingWire:
    wire: BookingWire = {
        "id": booking.id, "user": booking.user, "uid": booking.uid, "cards": list(booking.cards),
        "card_uuids": list(booking.card_uuids), "start": booking.start, "end": booking.end,
        "class": booking.klass, "note": booking.note, "status": booking.status, "request": booking.request,
        "created_at": booking.created_at, "requested_at": booking.requested_at, "queued": booking.queued,
        "series_id": booking.series_id, "notice": booking.notice, "host": booking.host,
    }
    if booking.project:
        wire["project"] = booking.project
    return wire


def booking_from_wire(data: dict[str, Any]) -> Booking:
    return Booking(
        id=data["id"], user=data["user"], uid=data["uid"], cards=tuple(data["cards"]),
        card_uuids=tuple(data["card_uuids"]), start=data["start"], end=data["end"], klass=data["class"],
        note=data["note"], status=data["status"], request=data.get("request"), created_at=data.get("created_at", 0),
        requested_at=data.get("requested_at", 0), queued=data.get("queued"), series_id=data.get("series_id"),
        notice=data.get("notice"), host=data.get("host", ""), project=data.get("project", ""),
    )

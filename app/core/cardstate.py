"""Each card's live state, derived from one telemetry snapshot and the bookings; never stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from app.gpu.model import CardReading, FleetSnapshot
from app.model import Booking

FREE, BOOKED, IN_USE, SQUATTED, LOST = "FREE", "BOOKED", "IN USE", "SQUATTED", "LOST"
HOT, FULL = "HOT", "FULL"
FULL_FRACTION = 0.9
UNKNOWN_USER = "container/unknown"


@dataclass(frozen=True, slots=True)
class CardStatus:
    reading: CardReading
    state: str
    warnings: tuple[str, ...]
    booking: Booking | None  # the booking holding the card now
    next_booking: Booking | None
    label: str | None = None
    host: str = ""  # the host the card is on ([fleet] host); '' on a board that names no hosts
    down_since: float | None = None  # its host's last heartbeat, when the host is down (HOST DOWN)

    @property
    def users(self) -> tuple[str, ...]:
        """Who runs processes on the card, in first-seen order."""
        return tuple(dict.fromkeys(p.user or UNKNOWN_USER for p in self.reading.processes))


def card_state(reading: CardReading, booking: Booking | None) -> str:
    if reading.lost:
        return LOST
    users = {p.user for p in reading.processes}
    if booking is None:
        return SQUATTED if users else FREE
    # A process we cannot attribute (another PID namespace) may well be the holder's container.
    if users - {booking.user, None}:
        return SQUATTED
    return IN_USE if users else BOOKED


def warnings(reading: CardReading, hot_celsius: int) -> tuple[str, ...]:
    found = []
    if reading.temperature_c is not None and reading.temperature_c >= hot_celsius:
        found.append(HOT)
    if reading.memory_used_mib is not None and reading.memory_total_mib:
        if reading.memory_used_mib >= FULL_FRACTION * reading.memory_total_mib:
            found.append(FULL)
    return tuple(found)


def fleet_status(
    snapshot: FleetSnapshot,
    bookings: Sequence[Booking],
    now: float,
    *,
    hot_celsius: int = 90,
    labels: dict[int, str] | None = None,
    host: str = "",
    down_since: float | None = None,
) -> tuple[CardStatus, ...]:
    """One CardStatus per card. `bookings`: live bookings that end after `now`, in start order. `host` and
    `down_since`: the host the snapshot is from, and since when it is down (app.service.fleet.hosts)."""
    by_card: dict[str, list[Booking]] = {}
    for booking in bookings:
        for uuid in booking.card_uuids:
            by_card.setdefault(uuid, []).append(booking)
    statuses = []
    for reading in snapshot.cards:
        mine = sorted(by_card.get(reading.uuid, ()), key=lambda b: b.start)
        current = next((b for b in mine if b.active(now)), None)
        upcoming = next((b for b in mine if b.start > now), None)
        statuses.append(
            CardStatus(
                reading=reading,
                state=card_state(reading, current),
                warnings=warnings(reading, hot_celsius),
                booking=current,
                next_booking=upcoming,
                label=(labels or {}).get(reading.index, reading.label),
                host=host,
                down_since=down_since,
            )
        )
    return tuple(statuses)

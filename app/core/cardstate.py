"""Each card's live state, derived from one telemetry snapshot and the bookings; never stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, cast

from app.gpu.model import CardReading, FleetSnapshot, WireCard, WireProcess, card_to_wire
from app.model import Booking, booking_to_wire

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


# `board status` shows a card as a view of the wire card (app.gpu.model.WireCard): every field but these, the PCIe
# traffic nested as `pcie`, and each process but its uid and start (docs/json.md#cards-board-status).
STATUS_LEAVES_OUT = frozenset({"lost", "sm_clock_mhz", "throttle_reasons", "serial", "slot", "numa_node", "pcie_gen",
                               "pcie_width", "pcie_max_gen", "pcie_max_width", "behind_chipset", "power_default_w",
                               "power_max_w", "persistence", "compute_capability", "energy_mj"})
STATUS_NESTS = {"pcie_tx_mib_s": ("pcie", "tx_mib_s"), "pcie_rx_mib_s": ("pcie", "rx_mib_s")}
STATUS_PROCESS_LEAVES_OUT = frozenset({"uid", "started_at"})
_STATUS_SHOWS = tuple((key, STATUS_NESTS.get(key)) for key in WireCard.__annotations__ if key not in STATUS_LEAVES_OUT)
_STATUS_PROCESS_SHOWS = tuple(key for key in WireProcess.__annotations__ if key not in STATUS_PROCESS_LEAVES_OUT)


def status_card(s: CardStatus) -> WireCard:
    """The whole wire card of a card's status: its reading (app.gpu.model.card_to_wire) and who is on it, with
    `host_down` and `down_since` where its host is down."""
    card = card_to_wire(s.reading)
    card["host"], card["label"], card["state"] = s.host, s.label, s.state
    card["warnings"], card["users"] = list(s.warnings), list(s.users)
    card["booking"] = booking_to_wire(s.booking) if s.booking else None
    card["next_booking"] = booking_to_wire(s.next_booking) if s.next_booking else None
    if s.down_since is not None:
        card["host_down"], card["down_since"] = True, s.down_since
    return card


def status_view(card: WireCard) -> dict[str, Any]:
    """`board status`'s view of a wire card, in the epochs of the wire: the fields STATUS_LEAVES_OUT leaves,
    STATUS_NESTS nested, and a process whose user the kernel hides (a container) named UNKNOWN_USER."""
    whole = cast("dict[str, Any]", card)  # read by the names WireCard declares
    shown: dict[str, Any] = {}
    for key, nest in _STATUS_SHOWS:
        if key not in whole:  # a status field the card has not got: host_down where its host is up
            continue
        if nest is not None:
            shown.setdefault(nest[0], {})[nest[1]] = whole[key]
        elif key == "processes":
            shown[key] = [_status_process(p) for p in card["processes"]]
        else:
            shown[key] = whole[key]
    return shown


def _status_process(process: WireProcess) -> dict[str, Any]:
    whole = cast("dict[str, Any]", process)
    return {key: whole[key] for key in _STATUS_PROCESS_SHOWS} | {"user": process["user"] or UNKNOWN_USER}

"""Energy on the bill: kWh over a window of cards, per booking, per user and per project, from the history file.

What a stretch of a card's time drew, by what the history holds for it (app.history.store):
- a raw sample whose `energy` is set: the J that NVML's energy counter counted since the card's previous sample
  ("counter"); a counter that went down (the driver reloaded) left it unset;
- any other raw sample: the trapezoid of its power and the previous sample's ("sampled");
- a stretch only the rollups still hold (older than [history] raw_hours): the bucket's mean power over its seconds,
  the counter's mean where the card has a counter ("counter"), else the samples' ("sampled"); a bucket the window
  holds in part counts in proportion.
A gap between two samples (the service was down) counts as GAP_SAMPLES samples at most, at the stretch's mean power:
an hour without samples is never an hour at full power. A sample counts in the window that holds its time, as the
rest of the history does; the energy it carries is the stretch that ends there.

A result says "counter" when all of it was counted by the counter, "sampled" when any of it came from power samples.
Core: no Textual, no service.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.core.cardstate import LOST
from app.history.store import (BUCKET_S, CARD_BITS, CARD_MASK, EPOCH, STATES, HistoryStore, _bucket_id, _rowid, _ts,
                               interval_mj)
from app.model import Booking

J_PER_KWH = 3_600_000
COUNTER, SAMPLED = "counter", "sampled"


@dataclass(frozen=True, slots=True)
class Energy:
    """What some cards drew over some time: joules, and where they came from (None: the history has nothing)."""

    joules: float = 0.0
    source: str | None = None

    @property
    def kwh(self) -> float:
        return self.joules / J_PER_KWH

    def __add__(self, other: Energy) -> Energy:
        sources = {s for s in (self.source, other.source) if s is not None}
        return Energy(self.joules + other.joules, SAMPLED if SAMPLED in sources else (COUNTER if sources else None))

    def to_wire(self) -> dict:
        """{"kwh", "source"}: kWh to the watt-hour, as `board report --json` and `board usage --json` carry it."""
        return {"kwh": round(self.kwh, 3), "source": self.source}


NOTHING = Energy()


def cards_energy(store: HistoryStore, uuids: Iterable[str], start: float, end: float) -> Energy:
    """What the cards `uuids` drew over [start, end); a card the history has never seen adds nothing."""
    if not store.path.exists() or end <= start:
        return NOTHING
    cards = store.cards()
    counters = {id for id, in store.conn.execute("SELECT id FROM cards WHERE counter = 1")}
    total = NOTHING
    for uuid in uuids:
        card = cards.get(uuid)
        if card is not None:
            total += _card_energy(store, card, card in counters, int(start), int(end))
    return total


def _card_energy(store: HistoryStore, card: int, counter: bool, start: int, end: int) -> Energy:
    # Raw samples where they are kept, from the first whole bucket after the oldest (the bucket it starts in was
    # pruned in part): the rollups before that.
    oldest = store.conn.execute("SELECT min(id) FROM samples").fetchone()[0]
    rolled_to = store.rolled_to()
    if oldest is None:
        raw_from = end  # rollups only
    elif rolled_to is None:
        raw_from = start  # nothing rolled up yet: the raw samples are all there is
    else:
        raw_from = min(-(-_ts(oldest) // BUCKET_S) * BUCKET_S, rolled_to)
    total = NOTHING
    if start < raw_from:
        total += _rolled(store, card, counter, start, min(end, raw_from))
    if end > raw_from:
        total += _raw(store, card, max(start, raw_from), end)
    return total


def _rolled(store: HistoryStore, card: int, counter: bool, start: int, end: int) -> Energy:
    joules, seen = 0.0, False
    for key, seconds, watts in store.conn.execute(
            f"SELECT id, n * dt, power_min + power_mean_d FROM rollups WHERE id >= ? AND id < ?"
            f" AND (id & {CARD_MASK}) = ? AND power_min IS NOT NULL",
            [_bucket_id(start, 0), _bucket_id(end - 1, 0) + (1 << CARD_BITS), card]):
        bucket = (key >> CARD_BITS) * BUCKET_S + EPOCH
        share = (min(end, bucket + BUCKET_S) - max(start, bucket)) / BUCKET_S
        if share > 0:
            joules += watts * seconds * share
            seen = True
    return Energy(joules, (COUNTER if counter else SAMPLED) if seen else None)


def _raw(store: HistoryStore, card: int, start: int, end: int) -> Energy:
    conn = store.conn
    # A lost card's power is no reading (the driver's last word, if anything).
    columns, where = f"id, dt, CASE WHEN state != {STATES.index(LOST)} THEN power END, energy", f"(id & {CARD_MASK}) = ?"
    # The card's sample before the window: the other end of the first sample's stretch.
    before = conn.execute(f"SELECT {columns} FROM samples WHERE id < ? AND {where} ORDER BY id DESC LIMIT 1",
                          [_rowid(start, 0), card]).fetchone()
    counted = sampled = 0.0
    seen = set()
    for key, dt, power, joules in conn.execute(
            f"SELECT {columns} FROM samples WHERE id >= ? AND id < ? AND {where} ORDER BY id",
            [_rowid(start, 0), _rowid(end, 0), card]):
        if joules is not None:
            counted += joules
            seen.add(COUNTER)
        elif before is not None and (found := interval_mj((_ts(before[0]), before[2], None),
                                                          (_ts(key), power, None), dt)) is not None:
            sampled += found[0] / 1000
            seen.add(SAMPLED)
        before = (key, dt, power, joules)
    return Energy(counted + sampled, SAMPLED if SAMPLED in seen else (COUNTER if seen else None))


def booking_energy(store: HistoryStore, booking: Booking, start: float, end: float) -> Energy:
    """What the booking's cards drew while it held them, within [start, end)."""
    return cards_energy(store, booking.card_uuids, max(start, booking.start), min(end, booking.end))


def energy_by(store: HistoryStore, bookings: Iterable[Booking], start: float, end: float,
              key: str) -> dict[str, Energy]:
    """Each live booking's energy within [start, end), summed by `key`: "booking" (its id), "user" or "project"."""
    return _summed(_each(store, bookings, start, end), key)


def _each(store: HistoryStore, bookings: Iterable[Booking], start: float, end: float) -> list[tuple[Booking, Energy]]:
    return [(b, booking_energy(store, b, start, end)) for b in bookings
            if b.status == "booked" and b.end > start and b.start < end]


def _summed(each: list[tuple[Booking, Energy]], key: str) -> dict[str, Energy]:
    found: dict[str, Energy] = {}
    for b, energy in each:
        name = str(b.id) if key == "booking" else b.user if key == "user" else b.project
        found[name] = found.get(name, NOTHING) + energy
    return found


def energy_report(store: HistoryStore, bookings: Iterable[Booking], start: float, end: float, *,
                  projects: bool) -> dict:
    """`board report`'s energy: kWh per user (most first) and, where the config has [[projects]], per project, and
    the total, each with its source; what the bookings' cards drew while they held them, within [start, end)."""
    each = _each(store, bookings, start, end)

    def listed(key: str) -> list[dict]:
        found = _summed(each, key)
        return [{key: name, **energy.to_wire()} for name, energy in
                sorted(found.items(), key=lambda item: (-item[1].joules, item[0])) if energy.source is not None]

    total = sum((energy for _, energy in each), NOTHING)
    return {"users": listed("user"), **({"projects": listed("project")} if projects else {}),
            "total": total.to_wire()}

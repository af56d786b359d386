"""Energy on the bill: kWh over a window of cards, per booking, per user and per project, from the history file.

Read as the report reads the history: the 5-minute rollups up to where they end, the raw samples after (minutes).
- A rollup: its mean power over its seconds; the counter's mean where all its samples had one (app.history.store),
  else the samples' mean. Its source is its card's: "counter" where the card has NVML's energy counter. A bucket
  the window holds in part counts in proportion.
- A raw sample whose `energy` is set: the J that NVML's energy counter counted since the card's previous sample
  ("counter"); a counter that went down (the driver reloaded) left it unset.
- Any other raw sample: the trapezoid of its power and the previous sample's ("sampled").
A gap between two samples (the service stalled) counts as GAP_SAMPLES samples at most, at the stretch's mean power:
an hour without samples is never an hour at full power. A sample counts in the window that holds its time, as the
rest of the history does; the energy it carries is the stretch that ends there. A LOST card draws nothing.

A result says "counter" when all of it was counted by the counter, "sampled" when any of it came from power samples.
Core: no Textual, no service.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.core.cardstate import LOST
from app.history.store import (BUCKET_S, CARD_BITS, CARD_MASK, GAP_SAMPLES, STATES, HistoryStore, _bucket_id, _rowid)
from app.model import Booking

J_PER_KWH = 3_600_000
LOOK_BACK_S = 3600
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
    return _Reader(store).energy(uuids, start, end)


class _Reader:
    """One read of the history file's cards and where its raw samples begin, for many windows (a report's)."""

    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        self.cards: dict[str, int] = {}
        self.counters: set[int] = set()
        self.raw_from = float("inf")  # raw samples from here on, the rollups before
        if not store.path.exists():
            return
        conn = store.conn
        self.cards = store.cards()
        self.counters = {id for id, in conn.execute("SELECT id FROM cards WHERE counter = 1")}
        # As the report reads them: the rollups up to where they end, the raw samples (minutes of them) after; where
        # nothing is rolled up yet, the raw samples are all there is.
        rolled_to = store.rolled_to()
        if conn.execute("SELECT 1 FROM samples LIMIT 1").fetchone() is not None:
            self.raw_from = float("-inf") if rolled_to is None else rolled_to

    def energy(self, uuids: Iterable[str], start: float, end: float) -> Energy:
        return self.energies([(uuids, start, end)])[0]

    def energies(self, windows: list[tuple[Iterable[str], float, float]]) -> list[Energy]:
        """What each window's cards drew over it: the rollups' part window by window, the raw samples' part of all of
        them in one pass (RAW)."""
        found = [NOTHING] * len(windows)
        raw: list[tuple[int, int, int, int]] = []  # (window, card, from, to) as rowids
        for i, (uuids, start, end) in enumerate(windows):
            start, end = int(start), int(end)
            for uuid in uuids:
                card = self.cards.get(uuid)
                if card is None or end <= start:
                    continue
                if start < self.raw_from:
                    found[i] += self._rolled(card, start, int(min(end, self.raw_from)))
                if end > self.raw_from:
                    raw.append((i, card, _rowid(int(max(start, self.raw_from)), card), _rowid(end, card)))
        if raw:
            conn = self.store.conn
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS energy_windows (k INTEGER, card INTEGER, lo INTEGER,"
                         " hi INTEGER)")
            conn.execute("DELETE FROM temp.energy_windows")
            conn.executemany("INSERT INTO temp.energy_windows VALUES (?, ?, ?, ?)", raw)
            lo = min(lo for _, _, lo, _ in raw) - (LOOK_BACK_S << CARD_BITS)
            for i, counted, sampled in conn.execute(RAW, [lo, max(hi for *_, hi in raw)]):
                source = SAMPLED if sampled is not None else COUNTER if counted is not None else None
                found[i] += Energy((counted or 0) + (sampled or 0), source)
        return found

    def _rolled(self, card: int, start: int, end: int) -> Energy:
        """The whole buckets summed in SQL (a month's booking is 8,640 of them), the one or two it cuts by share."""
        conn, joules, seen = self.store.conn, 0.0, 0
        power = f"FROM rollups WHERE (id & {CARD_MASK}) = ? AND power_min IS NOT NULL"
        first, last = -(-start // BUCKET_S) * BUCKET_S, end // BUCKET_S * BUCKET_S  # the whole buckets' span
        if last > first:
            whole, count = conn.execute(f"SELECT sum(n * dt * (power_min + power_mean_d)), count(*) {power}"
                                        " AND id >= ? AND id < ?",
                                        [card, _bucket_id(first, 0), _bucket_id(last, 0)]).fetchone()
            joules, seen = whole or 0.0, count
        for bucket in {b for b in (start // BUCKET_S * BUCKET_S, last) if b < end and b + BUCKET_S > start
                       and not (first <= b and b + BUCKET_S <= last)}:
            row = conn.execute(f"SELECT n * dt * (power_min + power_mean_d) {power} AND id = ?",
                               [card, _bucket_id(bucket, card)]).fetchone()
            if row is not None:
                joules += row[0] * (min(end, bucket + BUCKET_S) - max(start, bucket)) / BUCKET_S
                seen += 1
        return Energy(joules, (COUNTER if card in self.counters else SAMPLED) if seen else None)


# The raw samples' part of each window in temp.energy_windows (k, card, lo, hi: rowids), in one pass over the raw
# samples before the last `hi`: the J the counter counted, and the power samples' trapezoids where it did not
# (app.history.store.interval_mj's rule, in SQL: a stretch counts GAP_SAMPLES samples' time at most, a LOST card's
# power is no reading). A sample's stretch reaches back to its card's previous sample, in the window or not (up to
# LOOK_BACK_S before it).
RAW = f"""
    WITH s AS (SELECT id, id & {CARD_MASK} AS card, dt, energy, CASE WHEN state != {STATES.index(LOST)} THEN power END AS p
               FROM samples WHERE id >= ? AND id < ?),
         t AS MATERIALIZED (SELECT id, card, energy, CASE WHEN energy IS NULL THEN (lag(p) OVER w + p) / 2.0
                   * min((id - lag(id) OVER w) >> {CARD_BITS}, {GAP_SAMPLES} * max(1, dt)) END AS sampled
               FROM s WINDOW w AS (PARTITION BY card ORDER BY id))
    SELECT e.k, sum(t.energy), sum(t.sampled)
    FROM temp.energy_windows e CROSS JOIN t WHERE t.card = e.card AND t.id >= e.lo AND t.id < e.hi GROUP BY e.k"""


def booking_energy(store: HistoryStore, booking: Booking, start: float, end: float) -> Energy:
    """What the booking's cards drew while it held them, within [start, end)."""
    return _Reader(store).energy(booking.card_uuids, max(start, booking.start), min(end, booking.end))


def energy_by(store: HistoryStore, bookings: Iterable[Booking], start: float, end: float,
              key: str) -> dict[str, Energy]:
    """Each live booking's energy within [start, end), summed by `key`: "booking" (its id), "user" or "project"."""
    return _summed(_each(store, bookings, start, end), key)


def _each(store: HistoryStore, bookings: Iterable[Booking], start: float, end: float) -> list[tuple[Booking, Energy]]:
    held = [b for b in bookings if b.status == "booked" and b.end > start and b.start < end]
    found = _Reader(store).energies([(b.card_uuids, max(start, b.start), min(end, b.end)) for b in held])
    return list(zip(held, found))


def _summed(each: list[tuple[Booking, Energy]], key: str) -> dict[str, Energy]:
    found: dict[str, Energy] = {}
    for b, energy in each:
        name = str(b.id) if key == "booking" else b.user if key == "user" else b.project
        found[name] = found.get(name, NOTHING) + energy
    return found


def energy_rows(store: HistoryStore, bookings: Iterable[Booking], start: float, end: float, key: str) -> list[dict]:
    """The live bookings' energy within [start, end) by `key` ("user" or "project"), most first, as the wire carries
    it: [{key: name, "kwh", "source"}], a name whose cards the history never saw left out."""
    return _listed(_each(store, bookings, start, end), key)


def _listed(each: list[tuple[Booking, Energy]], key: str) -> list[dict]:
    found = _summed(each, key)
    return [{key: name, **energy.to_wire()} for name, energy in
            sorted(found.items(), key=lambda item: (-item[1].joules, item[0])) if energy.source is not None]


def energy_report(store: HistoryStore, bookings: Iterable[Booking], start: float, end: float, *,
                  projects: bool) -> dict:
    """`board report`'s energy: kWh per user (most first) and, where the config has [[projects]], per project, and
    the total, each with its source; what the bookings' cards drew while they held them, within [start, end)."""
    each = _each(store, bookings, start, end)
    total = sum((energy for _, energy in each), NOTHING)
    return {"users": _listed(each, "user"), **({"projects": _listed(each, "project")} if projects else {}),
            "total": total.to_wire()}

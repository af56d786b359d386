"""The cards' history: raw samples for `[history] raw_hours`, 5-minute rollups (min, mean, max) for `rollup_days`.

Its own SQLite file beside the board's (board.history.db), not tables in board.db:
- telemetry writes never take board.db's write lock, so a booking never waits behind a sample or a prune;
- a file-mode board watches board.db's data_version to reload bookings; samples there would fire it every 10 s;
- board.db stays small for its backups and checks, and the history can be deleted without losing a booking;
- the tables are sqlite-utils' (created if missing), outside the bookings' numbered migrations.

The budget is 50 MB for 8 cards and a year (841 k rollups), so the rows are lean, and two views spell them out:
- keys are one integer, the rowid, so no index repeats them: a sample is `(ts - EPOCH) << 8 | card`, a rollup
  `(ts - EPOCH) // 300 << 8 | card`, a user row under either `key << 6 | slot`; time ranges are rowid ranges;
- a rollup stores each metric's min and, as small offsets from it, its mean (rounded to the unit: MiB, %, °C,
  W, MHz) and max; offsets of 0 or 1 take no bytes at all;
- PCIe traffic (the busier direction, MiB/s) is kept raw, and in a rollup as its mean alone;
- a rollup's state is the one in most of its samples; who held the card is in the bookings (board.db), and who
  squatted it in `squats`, counted per sample;
- `sample_view` and `rollup_view` give ts, card, the state's name, and min/mean/max;
- `day_sums` sums each finished day's rollups per card, stretch and what the report tests (its state, and busy,
  VRAM at 90 %, 92 °C), so a year's report reads ~10^4 rows, not 841 k (see `summarise`);
- energy (app.history.energy), in the budget: a sample keeps the J that NVML's energy counter counted since the card's
  previous sample (`energy`; NULL where the card has no counter, or it started again); elsewhere the power samples
  answer. A rollup's power mean is its counted energy over its seconds where every sample of it has one (else the
  samples' mean), so a booking from last month still has its kWh; `cards.counter` says whose came from a counter.
  `energy_totals` adds up the J on each holder's (project, user) cards, never pruned: Prometheus's counter.
A card's id is its row in `cards` (by UUID), so a swapped card starts its own history.

Each connection belongs to one thread (sqlite-utils refuses others); `HistoryStore.db` opens one per thread.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence
from urllib.parse import quote

from app.core.cardstate import BOOKED, FREE, IN_USE, LOST, SQUATTED
from app.gpu.model import THROTTLE_THERMAL
from app.store.db import StoreError, _refuse_planted_links

BUCKET_S = 300
EPOCH = 1_704_067_200  # 2024-01-01 UTC: keys count from here, so they stay short
CARD_BITS = 8  # up to 256 card ids
SLOT_BITS = 6  # up to 64 users on one card at once
STATES = (FREE, BOOKED, IN_USE, SQUATTED, LOST)
METRICS = ("vram", "util", "temp", "power", "sm")  # MiB, %, °C, W, MHz
PRUNE_CHUNK_S = 3600  # one transaction deletes at most an hour of raw samples
ROLLUP_BATCH = 12  # one transaction rolls up at most an hour of buckets
DAY_BUCKETS = 86400 // BUCKET_S
HOT_C, VRAM_PCT = 92, 90  # the report's heat and VRAM verdicts (app.report.compute keeps them too)
SCHEMA = 2  # meta `schema`: raise it when _create adds to a file; a file at it is read as it is
ROLLUP_COLUMNS = ("n", "dt", "state", "n_throttled", "throttle",
                  *(f"{m}_{part}" for m in METRICS for part in ("min", "mean_d", "max_d")), "pcie_mean")
# A gap between two samples of a card (the service was down, a read stalled) counts as this many samples' time at
# most, at the mean power the counter (or the two power samples) give: an hour without samples is not an hour at full
# power.
GAP_SAMPLES = 2
# What `_roll` reads of a sample, by position (named: a file's columns are in the order they were added).
RAW_COLUMNS = ("id", "dt", "state", "booking", "vram", "util", "temp", "power", "power_limit", "sm", "throttle", "pcie",
               "energy")
SUMMARISE_DAYS = 7  # days one `summarise` call sums at most (a year's old file is backfilled a week a minute)


@dataclass(frozen=True, slots=True)
class Sample:
    """One card at one moment, as the sampler saw it. Metrics are None where the driver did not answer."""

    ts: int
    uuid: str
    state: str  # one of STATES
    dt: int  # the seconds this sample stands for ([history] sample_s)
    vram: int | None = None
    util: int | None = None
    temp: int | None = None
    power: int | None = None
    power_limit: int | None = None  # raw samples only; the rollups leave it out (it changes by hand, if ever)
    sm: int | None = None
    throttle: int | None = None  # THROTTLE_* bits
    pcie: int | None = None  # PCIe traffic, MiB/s, the busier of TX and RX
    booking: int | None = None  # the booking holding the card (raw samples; for rollups, see the bookings)
    holder: str | None = None  # that booking's user: anyone else's process is squatting
    users: tuple[tuple[str, int | None], ...] = ()  # (user, VRAM MiB) per user with processes on the card
    energy_mj: int | None = None  # NVML's energy counter (mJ since the driver loaded); None where the card has none
    project: str | None = None  # the holding booking's project ('' on a board without projects)


@dataclass(frozen=True, slots=True)
class Span:
    """One metric over a stretch of time: its least, mean and most."""

    min: float | None
    mean: float | None
    max: float | None


@dataclass(frozen=True, slots=True)
class Point:
    """A card over [ts, ts + step): each metric's span, from raw samples or rollups."""

    ts: int
    vram: Span
    util: Span
    temp: Span
    power: Span
    sm: Span
    n: int  # samples behind it


CARD_MASK = (1 << CARD_BITS) - 1


def _rowid(ts: int, card: int) -> int:
    return (ts - EPOCH) << CARD_BITS | card


def _ts(rowid: int) -> int:
    return (rowid >> CARD_BITS) + EPOCH


def _bucket_id(ts: int, card: int) -> int:
    return (ts - EPOCH) // BUCKET_S << CARD_BITS | card


def _bucket_ts(bucket_id: int) -> int:
    return (bucket_id >> CARD_BITS) * BUCKET_S + EPOCH


class HistoryStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._card_ids: dict[str, int] = {}
        self._last: dict[int, tuple[int, int | None, int | None]] = {}  # card -> its last sample's (ts, W, mJ)
        self._counters: set[int] = set()  # cards marked as having the energy counter, by this instance
        self._ready = False

    # -- connections and tables ------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # As for board.db: never write through a link someone planted where the file or its journal goes.
            if self.path.is_symlink():
                raise StoreError(f"{self.path} is a symbolic link, not the history's own file; remove it")
            _refuse_planted_links(self.path)
            conn = self._local.conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's plain connection, for reading: the tables made through `db` unless the file has them all
        (meta `schema`), so a report in file mode does not load sqlite-utils (and numpy with it)."""
        conn = self._open()
        if not self._ready:
            try:
                current = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (SCHEMA,)
            except sqlite3.OperationalError:  # no meta: a new file
                current = False
            if current:
                self._ready = True
            else:
                self.db  # noqa: B018 - makes the tables
        return conn

    @property
    def db(self):
        """This thread's sqlite_utils.Database (on `conn`), for writing; the tables exist once it is open."""
        db = getattr(self._local, "db", None)
        if db is None:
            import sqlite_utils  # start-up: sqlite-utils loads only when the history is written

            db = self._local.db = sqlite_utils.Database(self._open())
            if not self._ready:
                self._create(db)
                self._ready = True
        return db

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = self._local.db = None

    @staticmethod
    def _create(db) -> None:
        # The write lock first: a deferred transaction that read the schema before another thread's connection
        # created the tables cannot upgrade (SQLITE_BUSY_SNAPSHOT, at once, without the busy wait).
        db.conn.execute("BEGIN IMMEDIATE")
        try:
            HistoryStore._create_tables(db)
        except BaseException:
            db.conn.execute("ROLLBACK")
            raise
        db.conn.execute("COMMIT")

    @staticmethod
    def _create_tables(db) -> None:
        with db.atomic():
            db["cards"].create({"id": int, "uuid": str, "idx": int, "name": str, "memory_total": int},
                               pk="id", if_not_exists=True)
            db["cards"].create_index(["uuid"], unique=True, if_not_exists=True)
            db["meta"].create({"key": str, "value": int}, pk="key", if_not_exists=True)
            db["samples"].create({
                "id": int, "dt": int, "state": int, "booking": int, "vram": int, "util": int, "temp": int,
                "power": int, "power_limit": int, "sm": int, "throttle": int, "pcie": int,
            }, pk="id", if_not_exists=True)
            # A file from before PCIe traffic was kept (issue 23) gains the columns, last, as a new file has them.
            if "pcie" not in db["samples"].columns_dict:
                db["samples"].add_column("pcie", int)
            # Energy (schema 2): J the counter counted since the card's previous sample; an older file gains it
            # empty (its energy is its power samples').
            if "energy" not in db["samples"].columns_dict:
                db["samples"].add_column("energy", int)
            if "counter" not in db["cards"].columns_dict:
                db["cards"].add_column("counter", int)  # 1: the card has NVML's energy counter
            db["sample_users"].create({"id": int, "user": str, "vram": int, "squat": int}, pk="id", if_not_exists=True)
            columns: dict[str, type] = {"id": int, "n": int, "dt": int, "state": int, "n_throttled": int,
                                        "throttle": int}
            for metric in METRICS:
                columns |= {f"{metric}_min": int, f"{metric}_mean_d": int, f"{metric}_max_d": int}
            db["rollups"].create(columns, pk="id", if_not_exists=True)
            # PCIe traffic: the mean alone (what a TP group's share of its links needs), to stay in the budget.
            if "pcie_mean" not in db["rollups"].columns_dict:
                db["rollups"].add_column("pcie_mean", int)
            db["energy_totals"].create({"project": str, "user": str, "mj": int}, pk=("project", "user"),
                                       if_not_exists=True)
            db["squats"].create({"id": int, "user": str, "n": int}, pk="id", if_not_exists=True)
            # Added to older files empty: their days are summed later (`summarise`); until then a report reads
            # their rollups, so nothing is lost or counted twice.
            db["day_sums"].create({"id": int, "span": int, "n": int, "seconds": int, "util_sum": int, "util_s": int,
                                   "vram_max": int, "temp_max": int}, pk="id", if_not_exists=True)
            db["summed_days"].create({"day": int, "busy_util": float}, pk="day", if_not_exists=True)
            names = " ".join(f"WHEN {code} THEN '{state}'" for code, state in enumerate(STATES))
            db.create_view("sample_view", f"""
                SELECT id, (id >> {CARD_BITS}) + {EPOCH} AS ts, id & {CARD_MASK} AS card, dt,
                       CASE state {names} END AS state, booking, vram, util, temp, power, power_limit, sm, throttle,
                       pcie
                FROM samples""", replace=True)
            spans = ", ".join(f"{m}_min, {m}_min + {m}_mean_d AS {m}_mean, {m}_min + {m}_max_d AS {m}_max"
                              for m in METRICS)
            db.create_view("rollup_view", f"""
                SELECT (id >> {CARD_BITS}) * {BUCKET_S} + {EPOCH} AS ts, id & {CARD_MASK} AS card, n, n * dt AS seconds,
                       CASE state {names} END AS state, n_throttled, throttle, {spans}, pcie_mean
                FROM rollups""", replace=True)
            db["meta"].upsert({"key": "schema", "value": SCHEMA}, pk="key")

    def card_id(self, uuid: str, index: int | None = None, name: str | None = None,
                memory_total: int | None = None) -> int:
        """The card's id in this file, made on first sight."""
        found = self._card_ids.get(uuid)
        if found is None:
            db = self.db
            row = db.execute("SELECT id FROM cards WHERE uuid = ?", [uuid]).fetchone()
            if row is None:
                with db.atomic():
                    db["cards"].insert({"uuid": uuid, "idx": index, "name": name, "memory_total": memory_total})
                    row = db.execute("SELECT id FROM cards WHERE uuid = ?", [uuid]).fetchone()
            found = self._card_ids[uuid] = row[0]
            if found >= 1 << CARD_BITS:
                raise ValueError(f"the history holds {found} cards; at most {1 << CARD_BITS}")
        return found

    def cards(self) -> dict[str, int]:
        """Every card this file has seen: UUID -> id."""
        return {uuid: id for id, uuid in self.conn.execute("SELECT id, uuid FROM cards")}

    def _meta(self, key: str) -> int | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return None if row is None else row[0]

    # -- writing ---------------------------------------------------------------------------------

    def add(self, samples: Sequence[Sample]) -> None:
        """Record one round of samples in one short transaction. A sample already there (same card, same
        second) is kept as it was."""
        db = self.db
        rows, users = [], []
        totals: dict[tuple[str, str], int] = {}  # (project, user) -> mJ on the cards their bookings hold
        for s in samples:
            card = self.card_id(s.uuid)
            key = _rowid(s.ts, card)
            power, counter = (None, None) if s.state == LOST else (s.power, s.energy_mj)
            before = self._last.get(card)  # after a restart none: the first stretch is its power samples'
            energy = None if before is None else interval_mj(before, (s.ts, power, counter), s.dt)
            if counter is not None and card not in self._counters:
                db.execute("UPDATE cards SET counter = 1 WHERE id = ?", [card])
                self._counters.add(card)
            rows.append({"id": key, "dt": s.dt, "state": STATES.index(s.state), "booking": s.booking,
                         "vram": s.vram, "util": s.util, "temp": s.temp, "power": s.power,
                         "power_limit": s.power_limit, "sm": s.sm, "throttle": s.throttle, "pcie": s.pcie,
                         "energy": None if energy is None or energy[1] else _round(energy[0] / 1000)})
            self._last[card] = (s.ts, power, counter)
            if energy is not None and s.booking is not None and s.holder is not None:
                held = (s.project or "", s.holder)
                totals[held] = totals.get(held, 0) + energy[0]
            for slot, (user, vram) in enumerate(s.users[:1 << SLOT_BITS]):
                squat = s.state == SQUATTED and user != s.holder
                users.append({"id": key << SLOT_BITS | slot, "user": user, "vram": vram, "squat": int(squat)})
        with db.atomic():
            db["samples"].insert_all(rows, ignore=True)
            db["sample_users"].insert_all(users, ignore=True)
            for (project, user), mj in totals.items():
                db.execute('INSERT INTO energy_totals (project, "user", mj) VALUES (?, ?, ?)'
                           " ON CONFLICT (project, \"user\") DO UPDATE SET mj = mj + excluded.mj", [project, user, mj])

    def energy_totals(self) -> dict[tuple[str, str], float]:
        """Joules on the cards each (project, user)'s bookings held, since the file began: never pruned (a counter)."""
        return energy_totals(self.path)

    def roll_up(self, now: float, *, batches: int | None = None) -> int:
        """Roll the finished 5-minute buckets into `rollups`, an hour of buckets per transaction; returns how
        many buckets were written. A bucket is finished once `now` is past its end."""
        db, done = self.db, 0
        end = int(now) // BUCKET_S * BUCKET_S  # buckets before this one are finished
        while batches is None or batches > 0:
            mark = self._meta("rolled_to")
            if mark is None:
                first = db.execute("SELECT min(id) FROM samples").fetchone()[0]
                if first is None:
                    return done
                mark = _bucket_ts(_bucket_id(_ts(first), 0))
            # Skip hours with no samples at all (the service was down) in one step.
            following = db.execute("SELECT min(id) FROM samples WHERE id >= ?", [_rowid(mark, 0)]).fetchone()[0]
            if following is None:
                return done
            mark = max(mark, _bucket_ts(_bucket_id(_ts(following), 0)))
            if mark >= end:
                return done
            stop = min(end, mark + ROLLUP_BATCH * BUCKET_S)
            with db.atomic():
                raw = db.execute(f"SELECT {', '.join(RAW_COLUMNS)} FROM samples WHERE id >= ? AND id < ? ORDER BY id",
                                 [_rowid(mark, 0), _rowid(stop, 0)]).fetchall()
                squatters = db.execute("SELECT id, user FROM sample_users WHERE squat AND id >= ? AND id < ?",
                                       [_rowid(mark, 0) << SLOT_BITS, _rowid(stop, 0) << SLOT_BITS]).fetchall()
                rollups, squats = _roll(raw, squatters)
                db["rollups"].insert_all(rollups, replace=True)
                db["squats"].insert_all(squats, replace=True)
                db["meta"].upsert({"key": "rolled_to", "value": stop}, pk="key")
            done += len({r["id"] >> CARD_BITS for r in rollups})
            if batches is not None:
                batches -= 1
        return done

    def prune(self, now: float, *, raw_hours: float, rollup_days: float) -> tuple[int, int]:
        """Delete raw samples older than `raw_hours` (only once rolled up) and rollups older than `rollup_days`,
        an hour of raw samples per transaction. Returns (samples, rollups) deleted."""
        db = self.db
        cutoff = int(now - raw_hours * 3600)
        rolled_to = self._meta("rolled_to") or 0
        cutoff = min(cutoff, rolled_to)  # never drop what no rollup holds yet
        samples = rollups = 0
        while True:
            first = db.execute("SELECT min(id) FROM samples").fetchone()[0]
            if first is None or _ts(first) >= cutoff:
                break
            upto = min(cutoff, _ts(first) + PRUNE_CHUNK_S)
            with db.atomic():
                samples += db.execute("DELETE FROM samples WHERE id < ?", [_rowid(upto, 0)]).rowcount
                db.execute("DELETE FROM sample_users WHERE id < ?", [_rowid(upto, 0) << SLOT_BITS])
        oldest = _bucket_id(int(now - rollup_days * 86400), 0)
        with db.atomic():
            rollups = db.execute("DELETE FROM rollups WHERE id < ?", [oldest]).rowcount
            db.execute("DELETE FROM squats WHERE id < ?", [oldest << SLOT_BITS])
            if rollups:  # a day pruned in part is summed again from what is left (read from its rollups till then)
                day = (oldest >> CARD_BITS) // DAY_BUCKETS
                db.execute("DELETE FROM day_sums WHERE id < ?", [(day + 1) * DAY_BUCKETS << SUM_BITS])
                db.execute("DELETE FROM summed_days WHERE day <= ?", [day])
        return samples, rollups

    def summarise(self, busy_util: float, *, days: int | None = SUMMARISE_DAYS) -> int:
        """Sum the finished days' rollups into `day_sums` for a report at `busy_util` %, newest first, at most
        `days` of them (None: all); a day summed for another busy_util is summed again. Returns the days summed.

        Per card, a day's rollups are cut into stretches where the holder changes (the booking in the raw samples,
        while they are kept: a day is summed once it is finished, within `raw_hours` 48), or else the state's kind
        (free or squatted, booked or in use, lost), the buckets either side of each change alone (a booking that
        starts or ends inside a bucket has it there), and each stretch summed per state, busy, full and hot. So
        one booking held the whole stretch or none did, as the report checks against the bookings
        (app.report.gather) before it takes the sums; where it did not, the report reads the stretch's rollups."""
        db = self.db
        first = db.execute("SELECT min(id) FROM rollups").fetchone()[0]
        rolled_to = self._meta("rolled_to")
        if first is None or rolled_to is None:
            return 0
        done = {day for day, in db.execute("SELECT day FROM summed_days WHERE busy_util = ?", [busy_util])}
        last = (rolled_to - EPOCH) // BUCKET_S // DAY_BUCKETS  # the day rolled_to is in is not finished
        todo = [d for d in range(last - 1, (first >> CARD_BITS) // DAY_BUCKETS - 1, -1) if d not in done]
        memory = {card: total for card, total in db.execute("SELECT id, memory_total FROM cards")}
        for day in sorted(todo[:days]):  # the newest days first, each call's in order (the table fills its pages)
            lo, hi = day * DAY_BUCKETS << CARD_BITS, (day + 1) * DAY_BUCKETS << CARD_BITS
            rows = db.execute("SELECT id, n, dt, state, util_min, util_mean_d, vram_min, vram_max_d, temp_min,"
                              " temp_max_d FROM rollups WHERE id >= ? AND id < ?", [lo, hi]).fetchall()
            # Who held each card in each bucket, where the raw samples are still there: one booking (0: none) in
            # all of its samples, or -1.
            holders = {bucket: first if first == last else -1 for bucket, first, last in db.execute(
                f"SELECT (id >> {CARD_BITS}) / {BUCKET_S} << {CARD_BITS} | (id & {CARD_MASK}) AS b,"
                " min(coalesce(booking, 0)), max(coalesce(booking, 0)) FROM samples WHERE id >= ? AND id < ?"
                " GROUP BY b", [_rowid(_bucket_ts(lo), 0), _rowid(_bucket_ts(hi), 0)])}
            with db.atomic():
                db.execute("DELETE FROM day_sums WHERE id >= ? AND id < ?",
                           [lo >> CARD_BITS << SUM_BITS, hi >> CARD_BITS << SUM_BITS])
                db["day_sums"].insert_all(_day_sums(rows, holders, busy_util, memory), batch_size=1000)
                db["summed_days"].upsert({"day": day, "busy_util": busy_util}, pk="day")
        return min(len(todo), len(todo) if days is None else days)

    # -- reading ---------------------------------------------------------------------------------

    def series(self, uuid: str, start: float, end: float, step: int) -> list[Point]:
        """The card over [start, end) in steps of `step` seconds, oldest first; a step with no sample is left out.

        Steps under 5 minutes come from the raw samples; longer ones from the rollups, and from the raw samples
        after the last finished rollup, so the newest minutes are there too."""
        card = self.cards().get(uuid)
        if card is None or end <= start:
            return []
        start, end, step = int(start), int(end), max(1, int(step))
        if step < BUCKET_S:
            return self._raw_points(card, start, end, step)
        step = -(-step // BUCKET_S) * BUCKET_S
        rolled_to = min(self._meta("rolled_to") or start, end)
        points = self._rollup_points(card, start, max(start, rolled_to), step) if rolled_to > start else []
        tail = self._raw_points(card, max(start, rolled_to), end, step, origin=start)
        if points and tail and tail[0].ts == points[-1].ts:  # the step the watermark cuts: one point of both
            points[-1] = _merge(points[-1], tail.pop(0))
        return points + tail

    def _raw_points(self, card: int, start: int, end: int, step: int, origin: int | None = None) -> list[Point]:
        origin = start if origin is None else origin
        spans = ", ".join(f"min({m}), avg({m}), max({m})" for m in METRICS)
        rows = self.db.execute(
            f"SELECT ? + ((id >> {CARD_BITS}) + {EPOCH} - ?) / ? * ? AS t, {spans}, count(*) FROM samples"
            f" WHERE id >= ? AND id < ? AND (id & {CARD_MASK}) = ? AND state != ? GROUP BY t ORDER BY t",
            [origin, origin, step, step, _rowid(start, 0), _rowid(end, 0), card, STATES.index(LOST)]).fetchall()
        return [_point(row) for row in rows]

    def _rollup_points(self, card: int, start: int, end: int, step: int) -> list[Point]:
        # A step's mean weighs each rollup by its samples.
        spans = ", ".join(f"min({m}_min), sum(({m}_min + {m}_mean_d) * n) * 1.0 / sum(n), max({m}_min + {m}_max_d)"
                          for m in METRICS)
        rows = self.db.execute(
            f"SELECT ? + ((id >> {CARD_BITS}) * {BUCKET_S} + {EPOCH} - ?) / ? * ? AS t, {spans}, sum(n) FROM rollups"
            f" WHERE id >= ? AND id < ? AND (id & {CARD_MASK}) = ? GROUP BY t ORDER BY t",
            [start, start, step, step, _bucket_id(start, 0), _bucket_id(end, 0), card]).fetchall()
        return [_point(row) for row in rows]

    def samples(self, start: float, end: float, uuid: str | None = None) -> list[dict]:
        """Raw samples over [start, end) from `sample_view` (uuid added), oldest first, each with its users' VRAM
        (`users`: user, vram, squat)."""
        cards = self.cards()
        uuids = {id: u for u, id in cards.items()}
        where, args = "id >= ? AND id < ?", [_rowid(int(start), 0), _rowid(int(end), 0)]
        if uuid is not None:
            where, args = where + " AND card = ?", [*args, cards.get(uuid, -1)]
        found = [{**row, "uuid": uuids[row["card"]], "users": []}
                 for row in _query(self.conn, f"SELECT * FROM sample_view WHERE {where} ORDER BY id", args)]
        by_key = {row["id"]: row for row in found}
        if found:
            for row in _query(self.conn, "SELECT * FROM sample_users WHERE id >= ? AND id < ?",
                                     [found[0]["id"] << SLOT_BITS, (found[-1]["id"] + 1) << SLOT_BITS]):
                owner = by_key.get(row["id"] >> SLOT_BITS)
                if owner is not None:
                    owner["users"].append({"user": row["user"], "vram": row["vram"], "squat": bool(row["squat"])})
        return found

    def rollups(self, start: float, end: float, uuid: str | None = None) -> list[dict]:
        """Rollups over [start, end) from `rollup_view` (ts, card, uuid, state counts, each metric's min, mean,
        max), oldest first: what a report over months reads."""
        uuids = {id: u for u, id in self.cards().items()}
        where, args = "ts >= ? AND ts < ?", [int(start), int(end)]
        if uuid is not None:
            where, args = where + " AND card = ?", [*args, self.cards().get(uuid, -1)]
        return [{**row, "uuid": uuids[row["card"]]}
                for row in self.db.query(f"SELECT * FROM rollup_view WHERE {where} ORDER BY ts, card", args)]

    def squats(self, start: float, end: float) -> list[dict]:
        """Who squatted which card when, per 5-minute bucket: ts, uuid, user, samples (`n`)."""
        uuids = {id: u for u, id in self.cards().items()}
        rows = self.db.execute("SELECT id, user, n FROM squats WHERE id >= ? AND id < ? ORDER BY id",
                               [_bucket_id(int(start), 0) << SLOT_BITS, _bucket_id(int(end), 0) << SLOT_BITS])
        found = []
        for key, user, n in rows:
            bucket = key >> SLOT_BITS
            found.append({"ts": _bucket_ts(bucket), "uuid": uuids[bucket & CARD_MASK],
                          "user": user, "n": n})
        return found

    def rollup_rows(self, after: int | None, buckets: int) -> tuple[list[tuple], list[tuple]]:
        """The first `buckets` 5-minute buckets after the bucket starting at `after` (None: from the first), from the
        first one that has rollups: their rollups as (uuid, ts, *ROLLUP_COLUMNS) and their squats as (uuid, ts,
        user, n), oldest first. What app.history.fleet copies to a PostgreSQL store (and board migrate)."""
        conn = self.conn
        lo = 0 if after is None else max(0, _bucket_id(int(after) + BUCKET_S, 0))
        first = conn.execute("SELECT min(id) FROM rollups WHERE id >= ?", [lo]).fetchone()[0]
        if first is None:
            return [], []
        lo = first >> CARD_BITS << CARD_BITS
        hi = lo + (buckets << CARD_BITS)
        uuids = {id: u for u, id in self.cards().items()}
        found = [(uuids[row[0] & CARD_MASK], _bucket_ts(row[0]), *row[1:]) for row in conn.execute(
            f"SELECT id, {', '.join(ROLLUP_COLUMNS)} FROM rollups WHERE id >= ? AND id < ? ORDER BY id", [lo, hi])
            if row[0] & CARD_MASK in uuids]
        squats = [(uuids[key >> SLOT_BITS & CARD_MASK], _bucket_ts(key >> SLOT_BITS), user, n) for key, user, n in
                  conn.execute("SELECT id, user, n FROM squats WHERE id >= ? AND id < ? ORDER BY id",
                               [lo << SLOT_BITS, hi << SLOT_BITS]) if key >> SLOT_BITS & CARD_MASK in uuids]
        return found, squats

    def rolled_to(self) -> int | None:
        """Where the rollups end: buckets before this epoch second are rolled up."""
        return self._meta("rolled_to")


def energy_totals(path: Path) -> dict[tuple[str, str], float]:
    """The file's `energy_totals` in J, read on a read-only connection of its own (for /metrics, on any thread):
    empty where the file or the table is not there yet."""
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error:
        return {}
    try:
        return {(project, user): mj / 1000 for project, user, mj in
                conn.execute('SELECT project, "user", mj FROM energy_totals')}
    except sqlite3.OperationalError:  # a file from before energy (schema 1): the sampler adds the table
        return {}
    finally:
        conn.close()


def interval_mj(before: tuple[int, int | None, int | None], now: tuple[int, int | None, int | None],
                dt: int) -> tuple[int, bool] | None:
    """The energy of a card between two of its samples, each (ts, power W, counter mJ): (mJ, whether it came from the
    power samples), or None when neither the counter nor the power answers for both.

    The counter's difference where both have it and it did not go down (it starts again at 0 when the driver
    reloads: that stretch falls back to the power); else the trapezoid of the two powers. A gap longer than
    GAP_SAMPLES samples counts that long, at the stretch's mean power."""
    (t0, p0, c0), (t1, p1, c1) = before, now
    gap = t1 - t0
    if gap <= 0:
        return None
    counted = min(gap, GAP_SAMPLES * max(1, dt))
    if c0 is not None and c1 is not None and c1 >= c0:
        return round((c1 - c0) * counted / gap), False
    if p0 is not None and p1 is not None:
        return round((p0 + p1) / 2 * counted * 1000), True
    return None


def _query(conn: sqlite3.Connection, sql: str, args: Sequence) -> Iterable[dict]:
    """Rows as dicts (sqlite-utils' `query`, on a plain connection)."""
    cursor = conn.execute(sql, args)
    names = [d[0] for d in cursor.description]
    return (dict(zip(names, row)) for row in cursor)


def _merge(a: Point, b: Point) -> Point:
    def span(x: Span, y: Span) -> Span:
        if x.mean is None or y.mean is None:
            return x if y.mean is None else y
        # A span with a mean has its least and most.
        assert x.min is not None and y.min is not None and x.max is not None and y.max is not None
        return Span(min(x.min, y.min), (x.mean * a.n + y.mean * b.n) / (a.n + b.n), max(x.max, y.max))

    vram, util, temp, power, sm = (span(getattr(a, m), getattr(b, m)) for m in METRICS)
    return Point(a.ts, vram, util, temp, power, sm, n=a.n + b.n)


def _point(row) -> Point:
    values = list(row[1:-1])
    vram, util, temp, power, sm = (Span(*values[i:i + 3]) for i in range(0, len(values), 3))
    return Point(int(row[0]), vram, util, temp, power, sm, n=int(row[-1]))


def _roll(raw: Iterable[tuple], squatters: Iterable[tuple]) -> tuple[list[dict], list[dict]]:
    """Rollup rows (and squat rows) from raw sample rows, one per card and 5-minute bucket."""
    groups: dict[int, list[tuple]] = {}
    for row in raw:
        groups.setdefault(_bucket_id(_ts(row[0]), row[0] & CARD_MASK), []).append(row)
    rollups: list[dict] = []
    lost = STATES.index(LOST)
    for key, rows in groups.items():
        # Columns: RAW_COLUMNS
        states = [r[2] for r in rows]
        # dt, not the seconds: 10 takes a byte, 300 two (a year of rollups is 841 k rows).
        rollup = {"id": key, "n": len(rows), "dt": _round(sum(r[1] for r in rows) / len(rows)),
                  "state": max(sorted(set(states)), key=states.count),
                  "n_throttled": sum(1 for r in rows if r[10] and r[10] & THROTTLE_THERMAL),
                  "throttle": _or(r[10] for r in rows)}
        pcie = [r[11] for r in rows if r[11] is not None and r[2] != lost]
        if pcie:
            rollup["pcie_mean"] = _round(sum(pcie) / len(pcie))
        for metric, column in zip(METRICS, (4, 5, 6, 7, 9)):
            values = [r[column] for r in rows if r[column] is not None and r[2] != lost]
            if values:
                least = min(values)
                rollup |= {f"{metric}_min": least, f"{metric}_mean_d": _round(sum(values) / len(values)) - least,
                           f"{metric}_max_d": max(values) - least}
        counted = [r[12] for r in rows if r[12] is not None]
        if counted and len(counted) == len(rows) and "power_min" in rollup:
            # The counter's mean power over the bucket, not the samples': what its energy is read back from.
            rollup["power_mean_d"] = _round(sum(counted) / sum(r[1] for r in rows)) - rollup["power_min"]
        rollups.append(rollup)
    squats: dict[tuple[int, str], int] = {}
    for key, user in squatters:
        sample = key >> SLOT_BITS
        bucket = _bucket_id(_ts(sample), sample & CARD_MASK)
        squats[(bucket, user)] = squats.get((bucket, user), 0) + 1
    squat_rows = []
    slots: dict[int, int] = {}
    for (bucket, user), n in sorted(squats.items()):
        slot = slots[bucket] = slots.get(bucket, -1) + 1
        if slot < 1 << SLOT_BITS:
            squat_rows.append({"id": bucket << SLOT_BITS | slot, "user": user, "n": n})
    return rollups, squat_rows


SUM_BITS = 17  # a day_sums id: first bucket << 17 | hot << 15 | full << 13 | busy << 11 | state << 8 | card
KINDS = {STATES.index(s): kind for kind, states in enumerate(((FREE, SQUATTED), (BOOKED, IN_USE), (LOST,)))
         for s in states}


def sum_key(card: int, state: int, util: int | None, vram: int | None, temp: int | None, memory: int | None,
            busy_util: float) -> int:
    """A rollup's low bits in day_sums (and the report's groups): card, state, and busy, full and hot, each 1, 0,
    or 2 when unknown, as SQL's comparisons with NULL."""
    def flag(value) -> int:
        return 2 if value is None else int(value)

    busy = flag(None if util is None else util >= busy_util)
    full = flag(None if vram is None else vram * 100 >= VRAM_PCT * (1 << 40 if memory is None else memory))
    hot = flag(None if temp is None else temp >= HOT_C)
    return card | state << CARD_BITS | busy << 11 | full << 13 | hot << 15


def _day_sums(rows: list[tuple], holders: dict[int, int], busy_util: float, memory: dict[int, int | None]) -> list[dict]:
    """A day's rollup rows (id, n, dt, state, util_min, util_mean_d, vram_min, vram_max_d, temp_min, temp_max_d)
    as day_sums rows: per card, per stretch, per sum_key. `holders`: rollup id -> its samples' booking (see
    `summarise`)."""
    by_card: dict[int, list[tuple]] = {}
    for row in sorted(rows):
        by_card.setdefault(row[0] & CARD_MASK, []).append(row)
    found: dict[int, list] = {}
    for card, rows in by_card.items():
        kinds = [(0, holders[r[0]]) if r[0] in holders else (1, KINDS[r[3]]) for r in rows]
        runs, begin = [], 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or kinds[i] != kinds[begin]:
                runs.append((begin, i - 1))
                begin = i
        for a, b in runs:
            # A run's first and last bucket alone where its holder or kind changes there (inside the day).
            stretches = []
            if a > 0:
                stretches.append((a, a))
                a += 1
            if b + 1 < len(rows) and b >= a:
                stretches.append((b, b))
                b -= 1
            if a <= b:
                stretches.append((a, b))
            for begin, end in stretches:
                first, last = rows[begin][0] >> CARD_BITS, rows[end][0] >> CARD_BITS
                for r in rows[begin:end + 1]:
                    util = None if r[4] is None or r[5] is None else r[4] + r[5]
                    vram = None if r[6] is None or r[7] is None else r[6] + r[7]
                    temp = None if r[8] is None or r[9] is None else r[8] + r[9]
                    key = first << SUM_BITS | sum_key(card, r[3], util, vram, temp, memory.get(card), busy_util)
                    sums = found.get(key)
                    if sums is None:
                        sums = found[key] = [last - first + 1, 0, 0, None, None, None, None]
                    seconds = r[1] * r[2]
                    sums[1] += r[1]
                    sums[2] += seconds
                    if util is not None:
                        sums[3] = (sums[3] or 0) + util * seconds
                    if r[4] is not None:
                        sums[4] = (sums[4] or 0) + seconds
                    if vram is not None:
                        sums[5] = vram if sums[5] is None else max(sums[5], vram)
                    if temp is not None:
                        sums[6] = temp if sums[6] is None else max(sums[6], temp)
    # In key order, so the table's pages fill (a file's budget: a year of 8 cards is ~11 k rows, 0.5 MB).
    return [{"id": key, "span": s[0], "n": s[1], "seconds": s[2], "util_sum": s[3], "util_s": s[4], "vram_max": s[5],
             "temp_max": s[6]} for key, s in sorted(found.items())]


def _round(value: float) -> int:
    """Half up, not to even: 2.5 is 3, as a person rounds."""
    return int(value + 0.5)


def _or(values: Iterable[int | None]) -> int | None:
    found = None
    for value in values:
        if value is not None:
            found = (found or 0) | value
    return found

"""With a PostgreSQL store, each host's 5-minute rollups go to the store too, so `board report` covers the fleet.

Raw samples stay in each host's history file; the sampler rolls them up there as on SQLite, and this host's pusher
copies each finished bucket's rollups (and squats) into the store's `rollups` and `rollup_squats` tables
(app.store.pg_schema), tagged with the host. The high-water mark is the store's own: the latest bucket it holds for
this host. So a database that was unreachable, or a service that was down, is caught up from the history file, and
a push that ran twice (or board migrate's copy before it) writes nothing twice (ON CONFLICT DO NOTHING).

The pusher is its own thread with its own connection: a database that hangs or is gone never delays a sample. It
wakes after each roll-up (about once a minute) and writes a day of buckets per transaction until it is level.
On SQLite nothing of this runs: the history file is the only place.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Callable

from app.history.store import ROLLUP_COLUMNS, HistoryStore

PUSH_BUCKETS = 288  # one transaction writes at most a day of buckets (8 cards: 2,304 rows)
RETRY_S = 60.0  # a pusher that failed (the database unreachable) tries again after this, or at the next roll-up

_INSERT_ROLLUPS = (f"INSERT INTO rollups (host, card_uuid, ts, {', '.join(ROLLUP_COLUMNS)})"
                   f" VALUES ({', '.join('?' * (len(ROLLUP_COLUMNS) + 3))}) ON CONFLICT DO NOTHING")
_INSERT_SQUATS = ('INSERT INTO rollup_squats (host, card_uuid, ts, "user", n) VALUES (?, ?, ?, ?, ?)'
                  " ON CONFLICT DO NOTHING")


def store_mark(conn, host: str) -> int | None:
    """The latest bucket (its start, epoch seconds) the store holds for `host`; None when none."""
    return conn.execute("SELECT max(ts) FROM rollups WHERE host = ?", [host]).fetchone()[0]


def push_batch(history: HistoryStore, conn, host: str, after: int | None, *, buckets: int = PUSH_BUCKETS) -> int | None:
    """Write the rollups of up to `buckets` buckets after `after` in one transaction; returns the last bucket written,
    or None when the history file has nothing after it. A bucket's rollups are written whole, in one transaction,
    so the store's mark (store_mark) never passes a bucket it holds in part."""
    rollups, squats = history.rollup_rows(after, buckets)
    if not rollups:
        return None
    conn.execute("BEGIN")
    try:
        conn.executemany(_INSERT_ROLLUPS, [(host, *row) for row in rollups])
        conn.executemany(_INSERT_SQUATS, [(host, *row) for row in squats])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return max(row[1] for row in rollups)


def push(history: HistoryStore, conn, host: str, *, after: int | None = None, batches: int | None = None) -> int:
    """Catch the store up with the history file, a batch per transaction, from the store's mark for `host` (or from
    `after`); returns the buckets' rows written. `batches`: at most this many transactions (None: until level)."""
    mark = store_mark(conn, host) if after is None else after
    written = 0
    while batches is None or batches > 0:
        last = push_batch(history, conn, host, mark)
        if last is None:
            break
        written += 1
        mark = last
        if batches is not None:
            batches -= 1
    return written


def prune(conn, host: str, before: int) -> int:
    """Delete `host`'s rollups and squats of buckets before `before`, as its history file prunes its own."""
    conn.execute("BEGIN")
    try:
        deleted = conn.execute("DELETE FROM rollups WHERE host = ? AND ts < ?", [host, before]).rowcount
        conn.execute("DELETE FROM rollup_squats WHERE host = ? AND ts < ?", [host, before])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return deleted


class Pusher:
    """`run(stop)` is the thread's loop; `wake` (set by the sampler after each roll-up) makes it push at once."""

    def __init__(self, history: HistoryStore, connect: Callable[[], sqlite3.Connection], host: str, *, rollup_days: float,
                 clock: Callable[[], float], log: Callable[[str], None] = print) -> None:
        self.history, self.connect, self.host, self.log = history, connect, host, log
        self.rollup_days, self.clock = rollup_days, clock
        self.wake = threading.Event()
        self._conn: sqlite3.Connection | None = None  # app.store.db.connect's: PostgreSQL's behind sqlite3's face

    def step(self) -> int:
        """Catch up once (opening the connection on first use); raises what the database said."""
        if self._conn is None:
            self._conn = self.connect()
        written = push(self.history, self._conn, self.host)
        prune(self._conn, self.host, int(self.clock() - self.rollup_days * 86400))
        return written

    def run(self, stop: threading.Event) -> None:
        failing = None  # the last failure logged: an unreachable database says so once, not every minute
        try:
            while not stop.is_set():
                self.wake.clear()
                try:
                    self.step()
                except Exception as error:  # noqa: BLE001 - the history file still has them: caught up at the next try
                    line = f"history: rollups not written to the store yet: {type(error).__name__}: {error}"
                    if line != failing:
                        self.log(line)
                    failing = line
                else:
                    if failing is not None:
                        self.log("history: rollups written to the store again")
                    failing = None
                self.wake.wait(RETRY_S)
                if stop.is_set():
                    break
        finally:
            self.history.close()
            if self._conn is not None:
                self._conn.close()

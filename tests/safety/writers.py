"""Writer processes for the crash and backup tests, and the invariants the database must keep.

`spawn` forks a real process that books 2, 4 or 8 cards (and cancels and extends) through
BookingService until it is killed. Each booking's note says how many cards it wanted
("want=4"), so `check` can prove that no booking is ever partly there.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time

from app.config import Config, Policy
from app.errors import BoardError
from app.core.identity import Identity
from app.store import events
from app.store.db import connect
from tests.conftest import FROZEN_NOW

IDLE, BEGUN, WROTE, COMMITTING = 0, 1, 2, 3
CONFIG = Config(policy=Policy(max_booking_hours=72, max_ahead_days=30, max_cards_per_user=64))


def _trace(state, slot: int):
    def trace(sql: str) -> None:
        head = sql.lstrip()[:24].upper()
        if head.startswith("BEGIN"):
            state[slot] = BEGUN
        elif head.startswith(("INSERT INTO BOOKINGS", "INSERT INTO BOOKING_CARDS", "UPDATE BOOKINGS", "INSERT INTO EVENTS",
                              "DELETE FROM BOOKING_CARDS")):
            state[slot] = WROTE if state[slot] != IDLE else IDLE
        elif head.startswith("COMMIT"):
            state[slot] = COMMITTING
        elif head.startswith("ROLLBACK"):
            state[slot] = IDLE
        elif state[slot] == COMMITTING:
            state[slot] = IDLE  # the next statement after COMMIT returned
    return trace


def writer(db_path, seed: int, state, slot: int) -> None:
    """Runs in a forked child until it is killed."""
    from app.service.rules.bookings import BookingService
    from app.gpu import open_source

    rng = random.Random(seed)
    conn = connect(db_path)
    conn.set_trace_callback(_trace(state, slot))
    if seed % 2:  # slower, and slowest between a booking's first write and its commit
        conn.set_progress_handler(lambda: time.sleep(0.001 if state[slot] == WROTE else 0.0002) or 0,
                                  rng.choice([50, 200, 1000]))
    fleet = open_source(True, clock=lambda: FROZEN_NOW).read()
    me = Identity(f"writer{seed % 5}", 5000 + seed % 5, False)
    service = BookingService(conn, me, CONFIG, fleet.cards, fleet.topology, clock=lambda: FROZEN_NOW)
    mine: list[int] = []
    state[slot] = IDLE
    while True:
        roll = rng.random()
        try:
            if roll < 0.12 and mine:
                service.cancel(mine.pop(rng.randrange(len(mine))))
            elif roll < 0.22 and mine:
                booking = service.get(rng.choice(mine))
                service.extend(booking.id, booking.end + 3600)
            else:
                want = rng.choice([2, 2, 4, 4, 8])
                start = FROZEN_NOW + 3600 * rng.randrange(1, 24 * 25)
                booking = service.create(count=want, start=start, end=start + 3600 * rng.choice([1, 2, 3]),
                                         klass="experiment", note=f"want={want}", request={"want": want})
                mine.append(booking.id)
        except BoardError:
            pass  # a conflict, or a booking already gone: refusals are part of the load


def spawn(db_path, seed: int, state, slot: int) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns into pytest
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            writer(db_path, seed, state, slot)
        finally:
            os._exit(0)
    return pid


def check(db_path) -> dict:
    """Everything that must hold after any crash; returns a few counts."""
    conn = sqlite3.connect(db_path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        partial = conn.execute(
            "SELECT b.id, b.note, b.request, count(bc.card_uuid) FROM bookings AS b"
            " LEFT JOIN booking_cards AS bc ON bc.booking_id = b.id GROUP BY b.id"
            " HAVING count(bc.card_uuid) != CAST(substr(b.note, 6) AS INTEGER)"
            "    OR json_extract(b.request, '$.want') != count(bc.card_uuid)"
        ).fetchall()
        assert partial == [], f"partial bookings: {partial[:5]}"
        overlaps = conn.execute(
            "SELECT x.booking_id, y.booking_id, x.card_uuid FROM booking_cards AS x"
            " JOIN booking_cards AS y ON y.card_uuid = x.card_uuid AND y.booking_id > x.booking_id"
            " JOIN bookings AS a ON a.id = x.booking_id JOIN bookings AS b ON b.id = y.booking_id"
            " WHERE a.status = 'booked' AND b.status = 'booked' AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at"
        ).fetchall()
        assert overlaps == [], f"overlapping bookings: {overlaps[:5]}"
        unaudited = conn.execute(
            "SELECT id FROM bookings WHERE id NOT IN (SELECT booking_id FROM events WHERE action = 'create' AND ok = 1)"
        ).fetchall()
        assert unaudited == [], f"bookings without their create event: {unaudited[:5]}"
        assert events.first_broken(conn) is None
        return {
            "bookings": conn.execute("SELECT count(*) FROM bookings").fetchone()[0],
            "live": conn.execute("SELECT count(*) FROM bookings WHERE status = 'booked'").fetchone()[0],
            "events": conn.execute("SELECT count(*) FROM events").fetchone()[0],
        }
    finally:
        conn.close()

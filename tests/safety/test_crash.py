"""kill -9 in the middle of multi-card bookings: the file stays whole, no booking is half there, none overlap.

Each iteration forks a few real writer processes that book 2, 4 or 8 cards (and cancel and extend)
through BookingService as fast as they can, then SIGKILLs every one of them after a random delay.
Half the writers run with an SQLite progress handler that yields the CPU every few hundred VM
steps: the same statements, only slower, so that more kills land inside a transaction. Each
writer reports through shared memory which statement it last started, so the test can count
how many kills hit a booking half-way (after its INSERT, before its COMMIT returned).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import random
import signal
import sqlite3
import time

import pytest

from app.config import Config, Policy
from app.core.errors import BoardError
from app.core.identity import Identity
from app.store import events
from app.store.db import connect
from tests.conftest import FROZEN_NOW

ITERATIONS = int(os.environ.get("BOARD_CRASH_ITERATIONS", "200"))
WRITERS = 3
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
    from app.core.bookings import BookingService
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


def test_kill_9_mid_booking_leaves_no_partial_booking_and_no_overlap(tmp_path):
    db_path = tmp_path / "board.db"
    connect(db_path).close()
    context = multiprocessing.get_context("fork")
    state = context.RawArray(ctypes.c_int, WRITERS)
    rng = random.Random(20261129)
    kills, mid_booking, counts, seen = 0, 0, {}, {}
    started = time.monotonic()
    for iteration in range(ITERATIONS):
        for slot in range(WRITERS):
            state[slot] = -1  # not yet connected
        pids = [spawn(db_path, iteration * WRITERS + slot, state, slot) for slot in range(WRITERS)]
        time.sleep(rng.uniform(0.01, 0.04))
        for slot, pid in enumerate(pids):
            seen[state[slot]] = seen.get(state[slot], 0) + 1
            if state[slot] in (WROTE, COMMITTING):
                mid_booking += 1
            os.kill(pid, signal.SIGKILL)
            kills += 1
            if rng.random() < 0.5:
                time.sleep(rng.uniform(0, 0.004))  # let the others run on past their first victim
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        counts = check(db_path)
    elapsed = time.monotonic() - started
    print(f"{ITERATIONS} iterations, {kills} kill -9s, {mid_booking} between a first write and COMMIT, {counts} in {elapsed:.1f} s; states {seen}")
    assert kills >= 200 * WRITERS or ITERATIONS < 200
    assert counts["bookings"] > ITERATIONS, "the writers hardly wrote anything; the test proves little"
    in_transaction = sum(n for s, n in seen.items() if s in (BEGUN, WROTE, COMMITTING))
    assert in_transaction >= kills // 2, f"only {in_transaction} of {kills} kills landed inside a transaction"
    assert mid_booking >= ITERATIONS // 5, f"only {mid_booking} kills landed between a first write and its commit"
    # And the file is still a working board: one more booking goes in.
    conn = connect(db_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


@pytest.mark.parametrize("point", ["after-insert", "before-commit"])
def test_a_writer_killed_at_a_chosen_point_leaves_nothing(tmp_path, point):
    """The deterministic version: stop a writer at an exact statement with SIGSTOP, then kill -9 it."""
    db_path = tmp_path / "board.db"
    connect(db_path).close()
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        try:
            from app.core.bookings import BookingService
            from app.gpu import open_source

            conn = connect(db_path)
            target = "INSERT INTO BOOKING_CARDS" if point == "after-insert" else "COMMIT"

            def trace(sql: str) -> None:
                if sql.lstrip().upper().startswith(target):
                    ready.set()
                    os.kill(os.getpid(), signal.SIGSTOP)

            conn.set_trace_callback(trace)
            fleet = open_source(True, clock=lambda: FROZEN_NOW).read()
            service = BookingService(conn, Identity("w", 5000, False), CONFIG, fleet.cards, fleet.topology,
                                     clock=lambda: FROZEN_NOW)
            service.create(count=4, start=FROZEN_NOW + 3600, end=FROZEN_NOW + 7200, note="want=4", request={"want": 4})
        finally:
            os._exit(0)
    assert ready.wait(30)
    time.sleep(0.05)
    # Another process must still be able to read, and, once the killed writer is gone, to write.
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert check(db_path)["bookings"] == 0
    conn = connect(db_path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    finally:
        conn.close()

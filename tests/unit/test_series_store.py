"""Series and queue rows (app.store.series, app.store.bookings): canonical JSON in; a row edited by hand is
reported once and skipped."""

from __future__ import annotations

import pytest

from app.store import bookings as rows
from app.store import series as store
from app.store.db import malformed_rows, write
from tests.conftest import sqlite_only

NOW = 1795966200


def test_the_rule_is_stored_as_canonical_json_and_read_back(conn):
    with write(conn):
        series_id = store.insert(conn, user="alice", uid=1001, rule={"to": "2026-12-11", "every": "day"}, now=NOW)
    assert conn.execute("SELECT rule FROM series WHERE id = ?", (series_id,)).fetchone()[0] == \
        '{"every": "day", "to": "2026-12-11"}'
    with write(conn):
        store.set_rule(conn, series_id, {"to": "2026-12-18", "every": "day"})
    assert conn.execute("SELECT rule FROM series WHERE id = ?", (series_id,)).fetchone()[0] == \
        '{"every": "day", "to": "2026-12-18"}'
    assert store.get(conn, series_id) == store.Series(series_id, "alice", 1001, {"every": "day", "to": "2026-12-18"}, NOW)


@pytest.mark.parametrize(
    "column, value, problem",
    [
        ("user", b"al", "user is bytes b'al'"),  # TEXT columns store a number as text: a blob is what breaks them
        ("uid", "x", "uid is str 'x'"),
        ("rule", b"{}", "rule is bytes b'{}'"),
        ("created_at", "soon", "created_at is str 'soon'"),
        ("rule", "{" + "x" * 50, "rule is not JSON ('{" + "x" * 38 + ")"),
        ("rule", "[1, 2]", "rule is JSON list, not an object"),
    ],
)
@sqlite_only  # hand edits of SQLite's loose types
def test_a_row_edited_by_hand_is_reported_once_and_skipped(conn, column, value, problem):
    with write(conn):
        series_id = store.insert(conn, user="alice", uid=1001, rule={"every": "day"}, now=NOW)
        conn.execute(f"UPDATE series SET {column} = ? WHERE id = ?", (value, series_id))
    before = len(malformed_rows())
    assert store.get(conn, series_id) is None
    assert store.get(conn, series_id) is None  # reported once
    line = f"series {series_id} is malformed: {problem}; skipped (a hand edit? see board doctor)"
    assert malformed_rows()[before:] == [line]


def queued_booking(service):
    """A booking on card 3 that joined the queue: it asked for NOW + 1 h and got NOW + 1.5 h, after another's.
    (One that gets the time it asked for is not queued: it can never move up.)"""
    service.create(cards=[3], start=NOW + 3600, end=NOW + 5400)
    booking = service.create(cards=[3], start=NOW + 3600, end=NOW + 7200, or_later=True)
    assert booking.start == NOW + 5400
    return booking


@pytest.mark.parametrize(
    "column, value, problem",
    [
        ("queued", "soon", "queued is 'soon', not time, cards or null"),
        ("queued", "q" * 50, f"queued is '{'q' * 39}, not time, cards or null"),
        ("requested_at", "x", "requested_at is str 'x'"),
    ],
)
@sqlite_only  # hand edits of SQLite's loose types
def test_a_queued_booking_edited_by_hand_is_reported_and_left_out_of_the_queue(make_service, conn, column, value,
                                                                                 problem):
    booking = queued_booking(make_service())
    conn.execute("PRAGMA ignore_check_constraints = ON")  # as a hand edit in the sqlite3 shell may
    with write(conn):
        conn.execute(f"UPDATE bookings SET {column} = ? WHERE id = ?", (value, booking.id))
    conn.execute("PRAGMA ignore_check_constraints = OFF")
    before = len(malformed_rows())
    assert rows.queued(conn, NOW) == []
    assert malformed_rows()[before:] == [f"booking {booking.id} is malformed: {problem}; skipped (a hand edit? see board"
                                         " doctor)"]


def test_a_booking_without_requested_at_was_wanted_from_its_start(make_service, conn):
    booking = queued_booking(make_service())
    with write(conn):
        conn.execute("UPDATE bookings SET requested_at = NULL WHERE id = ?", (booking.id,))
    assert [(b.id, b.requested_at) for b in rows.queued(conn, NOW)] == [(booking.id, NOW + 5400)]

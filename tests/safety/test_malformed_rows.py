"""A hand-edited row that no longer decodes is reported once, by id, and skipped; it never stops a listing.

In file mode any member may edit the database with the sqlite3 shell: a booking whose card rows
point nowhere, a request that is not JSON, text or NULL where an integer belongs, a server row
with a mistyped column. Each case here is such an edit, made with plain sqlite3.
"""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest

from app.llama import rows as servers
from app.store import bookings
from app.store.db import connect, malformed_rows, write
from tests.conftest import FROZEN_NOW, run_board

HOUR = 3600


@pytest.fixture
def seeded(db_path, fleet):
    """Four live bookings (ids 1-4, on cards 0-3) and one server on booking 1."""
    conn = connect(db_path)
    with write(conn):
        bookings.sync_cards(conn, fleet.cards, FROZEN_NOW)
        for n in range(4):
            bookings.insert(conn, user="alice", uid=1001, uuids=[fleet.cards[n].uuid], start=FROZEN_NOW + HOUR,
                            end=FROZEN_NOW + 2 * HOUR, klass="experiment", note=f"job {n}", request={"count": 1},
                            now=FROZEN_NOW, created_by=1001)
        servers.insert(conn, booking_id=1, user="alice", uid=1001, cards=[0], card_uuids=[fleet.cards[0].uuid],
                       model="/m.gguf", alias=None, host="127.0.0.1", port=8080, ctx=None, parallel=None,
                       split_mode=None, metrics=False, cmdline=["llama-server"], now=FROZEN_NOW)
        servers.insert(conn, booking_id=2, user="alice", uid=1001, cards=[1], card_uuids=[fleet.cards[1].uuid],
                       model="/m.gguf", alias=None, host="127.0.0.1", port=8081, ctx=None, parallel=None,
                       split_mode=None, metrics=False, cmdline=["llama-server"], now=FROZEN_NOW)
    yield conn
    conn.close()


def hand_edit(db_path, *statements: str) -> None:
    """What a member could do with the sqlite3 shell (constraints they can switch off, switched off)."""
    raw = sqlite3.connect(db_path, isolation_level=None)
    try:
        raw.execute("PRAGMA foreign_keys = OFF")
        raw.execute("PRAGMA ignore_check_constraints = ON")
        for statement in statements:
            raw.execute(statement)
    finally:
        raw.close()


def drop_not_null(db_path, table: str, column: str) -> None:
    """Rewrite the schema so that `column` takes NULL: the edit that lets a NULL in where an integer belongs."""
    raw = sqlite3.connect(db_path, isolation_level=None)
    try:
        raw.execute("PRAGMA writable_schema = ON")
        raw.execute("UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = ?",
                    (f"{column} INTEGER NOT NULL", f"{column} INTEGER", table))
        raw.execute("PRAGMA writable_schema = OFF")
    finally:
        raw.close()


BOOKING_EDITS = {
    "card-pointing-nowhere": ["UPDATE booking_cards SET card_uuid = 'GPU-nowhere' WHERE booking_id = 2"],
    "no-cards-at-all": ["DELETE FROM booking_cards WHERE booking_id = 2"],
    "request-not-json": ["UPDATE bookings SET request = '{not json' WHERE id = 2"],
    "request-a-list": ["UPDATE bookings SET request = '[1, 2]' WHERE id = 2"],
    "text-for-a-time": ["UPDATE bookings SET starts_at = 'soon' WHERE id = 2"],
    "float-for-a-uid": ["UPDATE bookings SET uid = 1.5 WHERE id = 2"],
    "blob-for-a-user": ["UPDATE bookings SET user = x'00ff' WHERE id = 2"],
    "unknown-status": ["UPDATE bookings SET status = 'maybe' WHERE id = 2"],
    "ends-before-it-starts": ["UPDATE bookings SET ends_at = starts_at - 10 WHERE id = 2"],
    "card-index-not-a-number": ["UPDATE cards SET idx = 'one' WHERE uuid ="
                                " (SELECT card_uuid FROM booking_cards WHERE booking_id = 2)"],
}


@pytest.mark.parametrize("edit", BOOKING_EDITS)
def test_a_malformed_booking_is_reported_once_and_skipped(db_path, seeded, edit, caplog):
    hand_edit(db_path, *BOOKING_EDITS[edit])
    with caplog.at_level(logging.WARNING, logger="app.store"):
        listed = bookings.listing(seeded, start=None, end=None, user=None, include_cancelled=True)
        live = bookings.live_between(seeded, FROZEN_NOW, FROZEN_NOW + 3 * HOUR)
        assert bookings.get(seeded, 2) is None
        assert bookings.get(seeded, 3).id == 3
    assert [b.id for b in listed] == [1, 3, 4]
    assert [b.id for b in live] == [1, 3, 4]
    reported = [r.getMessage() for r in caplog.records]
    assert len(reported) == 1, reported
    assert reported[0].startswith("booking 2 is malformed: ") and "skipped" in reported[0]
    assert reported[0].isascii() and reported[0].isprintable()
    assert reported[0] in malformed_rows()


def test_a_null_where_an_integer_belongs(db_path, seeded, caplog):
    drop_not_null(db_path, "bookings", "uid")
    hand_edit(db_path, "UPDATE bookings SET uid = NULL WHERE id = 3")
    reopened = connect(db_path)
    try:
        with caplog.at_level(logging.WARNING, logger="app.store"):
            listed = bookings.listing(reopened, start=None, end=None, user=None, include_cancelled=True)
    finally:
        reopened.close()
    assert [b.id for b in listed] == [1, 2, 4]
    assert [r.getMessage() for r in caplog.records] == [
        "booking 3 is malformed: uid is NULL; skipped (a hand edit? see board doctor)"]


def test_a_conflict_check_passes_over_a_malformed_booking_to_the_next(db_path, seeded, fleet):
    uuid = fleet.cards[0].uuid
    with write(seeded):  # a second booking on card 0, after booking 1
        bookings.insert(seeded, user="bob", uid=1002, uuids=[uuid], start=FROZEN_NOW + 2 * HOUR,
                        end=FROZEN_NOW + 3 * HOUR, klass="experiment", note="", request=None, now=FROZEN_NOW,
                        created_by=1002)
    hand_edit(db_path, "UPDATE bookings SET request = 'nope' WHERE id = 1")
    found = bookings.first_conflict(seeded, [uuid], FROZEN_NOW, FROZEN_NOW + 4 * HOUR)
    assert found is not None and found.id == 5


SERVER_EDITS = {
    "port-as-text": "UPDATE servers SET port = 'eighty' WHERE id = 2",
    "cards-not-json": "UPDATE servers SET cards = '[0,' WHERE id = 2",
    "cards-of-strings": """UPDATE servers SET cards = '["0"]' WHERE id = 2""",
    "cmdline-an-object": """UPDATE servers SET cmdline = '{"a": 1}' WHERE id = 2""",
    "unknown-state": "UPDATE servers SET state = 'zombie' WHERE id = 2",
    "log-tail-not-json": "UPDATE servers SET log_tail = 'oops' WHERE id = 2",
    "pid-as-text": "UPDATE servers SET pid = 'self' WHERE id = 2",
}


@pytest.mark.parametrize("edit", SERVER_EDITS)
def test_a_malformed_server_is_reported_once_and_skipped(db_path, seeded, edit, caplog):
    hand_edit(db_path, SERVER_EDITS[edit])
    with caplog.at_level(logging.WARNING, logger="app.store"):
        assert [s.id for s in servers.listing(seeded)] == [1]
        assert [s.id for s in servers.live(seeded)] == [1]
        assert servers.get(seeded, 2) is None
    reported = [r.getMessage() for r in caplog.records]
    assert len(reported) == 1 and reported[0].startswith("server 2 is malformed: "), reported


def test_an_escape_in_the_bad_value_reaches_the_log_inert(db_path, seeded, caplog):
    hand_edit(db_path, "UPDATE bookings SET request = char(27) || '[31mred' WHERE id = 4")
    with caplog.at_level(logging.WARNING, logger="app.store"):
        bookings.listing(seeded, start=None, end=None, user=None, include_cancelled=True)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\x1b" not in line and line.isprintable()


def test_the_cli_lists_the_rest_and_names_the_bad_row(db_path, seeded):
    hand_edit(db_path, "UPDATE bookings SET request = '{not json' WHERE id = 2")
    result = run_board("list", "--all", "--json", env={"BOARD_DB": str(db_path), "BOARD_SIMULATE": "1"})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert [b["id"] for b in json.loads(result.stdout)["bookings"]] == [1, 3, 4]
    assert [line for line in result.stderr.splitlines() if "malformed" in line] == [
        "booking 2 is malformed: request is not JSON ('{not json'); skipped (a hand edit? see board doctor)"]

"""The store's booking rows and the calendar in memory at their edges: what `make mutation` found untold apart.

The calendar (app.store.bookings.Calendar) must answer as the SQL does on the same connection, and read again only
what changed: each test here makes a change the calendar must see and asks both."""

from __future__ import annotations

import pytest

from app.gpu.model import CardReading
from app.store import bookings
from app.store.db import connect, write
from tests.conftest import FROZEN_NOW, sqlite_only
from tests.safety.test_malformed_rows import hand_edit
from tests.unit.test_store_rows import CARDS, HOUR, book, reported

pytestmark = sqlite_only  # the calendar in memory is SQLite's alone
SINCE = FROZEN_NOW - 86400
RENUMBERED = [CardReading(index=1, uuid="GPU-aaaa", name="H100"), CardReading(index=0, uuid="GPU-bbbb", name="H100")]


@pytest.fixture
def kept(conn, db_path):
    """A second connection to the same file that keeps a calendar (as the service's does); `conn` keeps none."""
    with write(conn):
        bookings.sync_cards(conn, CARDS, FROZEN_NOW)
    kept = connect(db_path)
    bookings.keep_calendar(kept, SINCE)
    yield kept
    kept.close()


def answers(conn, ids) -> tuple:
    """What a reader asks of the bookings: each one by id, the live ones in a window (all, one user's), the busy
    spans, the first conflict."""
    return ([bookings.get(conn, i) for i in ids],
            bookings.live_between(conn, FROZEN_NOW, FROZEN_NOW + 30 * HOUR),
            bookings.live_between(conn, FROZEN_NOW, FROZEN_NOW + 30 * HOUR, user="bob"),
            bookings.busy_by_card(conn, FROZEN_NOW),
            bookings.first_conflict(conn, ["GPU-aaaa", "GPU-bbbb"], FROZEN_NOW, FROZEN_NOW + 30 * HOUR))


def assert_true_to_sql(kept, ids) -> None:
    """The calendar's answers are the SQL's on the same connection (inside its transaction too)."""
    calendar = kept.calendar
    from_memory = answers(kept, ids)
    kept.calendar = None
    try:
        assert from_memory == answers(kept, ids)
    finally:
        kept.calendar = calendar


def bookings_read(kept, action) -> list[str]:
    """The statements that read the bookings table while `action` runs."""
    statements: list[str] = []
    kept.set_trace_callback(statements.append)
    try:
        action()
    finally:
        kept.set_trace_callback(None)
    return [s for s in statements if "from bookings" in s.lower()]



def undo_a_notice(conn, booking_id: int, undo: str) -> None:
    """Set a booking's notice in a write that then rolls back whole ("rollback") or to its savepoint ("rollback to")."""
    if undo == "rollback":
        with pytest.raises(RuntimeError), write(conn):
            bookings.set_notice(conn, booking_id, "undone")
            raise RuntimeError("rolled back")
    else:
        with write(conn, savepoint="attempt"):
            bookings.set_notice(conn, booking_id, "undone")
            conn.execute("ROLLBACK TO attempt")
            bookings.rolled_back(conn)

def test_every_change_this_module_makes_is_seen_by_the_next_read(kept):
    a = book(kept, request={"count": 1})
    b = book(kept, uuids=("GPU-bbbb",), user="bob", uid=1002, start=FROZEN_NOW + 5 * HOUR, end=FROZEN_NOW + 6 * HOUR)
    ids = [a, b]
    assert_true_to_sql(kept, ids)  # loaded
    for change in (lambda: bookings.set_times(kept, a, FROZEN_NOW + 2 * HOUR, FROZEN_NOW + 4 * HOUR),
                   lambda: bookings.set_notice(kept, a, "moved by admin"),
                   lambda: bookings.set_queued(kept, a, "time"),
                   lambda: bookings.set_queued(kept, a, None),
                   lambda: bookings.set_owner(kept, a, "bob", 1002),
                   lambda: bookings.set_cards(kept, a, ["GPU-bbbb"]),
                   lambda: bookings.set_cancelled(kept, b)):
        with write(kept):
            change()
            assert_true_to_sql(kept, ids)
        assert_true_to_sql(kept, ids)
    assert bookings.get(kept, a).notice == "moved by admin"
    assert bookings.live_between(kept, FROZEN_NOW, FROZEN_NOW + 30 * HOUR, user="bob")[0].card_uuids == ("GPU-bbbb",)


def test_the_calendar_reads_from_memory_and_again_only_what_changed(kept, db_path):
    a = book(kept)
    b = book(kept, uuids=("GPU-bbbb",), user="bob", uid=1002)
    assert len(bookings_read(kept, lambda: answers(kept, [a, b]))) == 1  # the first read loads all
    assert bookings_read(kept, lambda: answers(kept, [a, b])) == []  # then none, outside a transaction
    with write(kept):
        assert bookings_read(kept, lambda: answers(kept, [a, b])) == []  # nor inside one

    def moved(booking_id, hours):
        with write(kept):
            bookings.set_times(kept, booking_id, FROZEN_NOW + hours * HOUR, FROZEN_NOW + (hours + 1) * HOUR)

    moved(a, 3)  # committed: only `a` is read again
    read = bookings_read(kept, lambda: answers(kept, [a, b]))
    assert len(read) == 1 and f"where b.id = {a} " in read[0].lower()
    assert bookings_read(kept, lambda: answers(kept, [a, b])) == []

    with write(kept, savepoint="attempt"):  # a ROLLBACK TO reads again only what changed since its savepoint
        bookings.set_times(kept, b, FROZEN_NOW + 7 * HOUR, FROZEN_NOW + 8 * HOUR)
        answers(kept, [a, b])
        kept.execute("ROLLBACK TO attempt")
        bookings.rolled_back(kept)
        read = bookings_read(kept, lambda: answers(kept, [a, b]))
        assert len(read) == 1 and f"where b.id = {b} " in read[0].lower()
        assert bookings.get(kept, b).start == FROZEN_NOW + HOUR
    assert bookings_read(kept, lambda: answers(kept, [a, b])) == []  # the transaction's end read it already

    with pytest.raises(RuntimeError), write(kept):  # a rolled-back transaction: again only what it changed
        bookings.set_times(kept, a, FROZEN_NOW + 9 * HOUR, FROZEN_NOW + 10 * HOUR)
        answers(kept, [a, b])
        raise RuntimeError("rolled back")
    read = bookings_read(kept, lambda: answers(kept, [a, b]))
    assert len(read) == 1 and f"where b.id = {a} " in read[0].lower()
    assert bookings.get(kept, a).start == FROZEN_NOW + 3 * HOUR

    other = connect(db_path)  # another writer: all is read again, once
    with write(other):
        bookings.set_notice(other, b, "from elsewhere")
    other.close()
    assert len(bookings_read(kept, lambda: answers(kept, [a, b]))) == 1
    assert bookings_read(kept, lambda: answers(kept, [a, b])) == []
    assert bookings.get(kept, b).notice == "from elsewhere"


def test_a_calendar_loaded_inside_a_transaction_reads_all_again_after_it_rolls_back(kept):
    a = book(kept)
    with pytest.raises(RuntimeError), write(kept):
        bookings.set_times(kept, a, FROZEN_NOW + 3 * HOUR, FROZEN_NOW + 4 * HOUR)
        with write(kept):  # a savepoint (the group commit's): what changed before it is not "recent"
            assert bookings.get(kept, a).start == FROZEN_NOW + 3 * HOUR  # loaded here, with the change
        raise RuntimeError("rolled back")
    assert_true_to_sql(kept, [a])
    assert bookings.get(kept, a).start == FROZEN_NOW + HOUR
    assert bookings_read(kept, lambda: answers(kept, [a])) == []


def test_a_change_read_before_a_savepoint_is_read_again_when_the_whole_transaction_rolls_back(kept):
    a = book(kept)
    assert_true_to_sql(kept, [a])
    with pytest.raises(RuntimeError), write(kept):
        bookings.set_times(kept, a, FROZEN_NOW + 3 * HOUR, FROZEN_NOW + 4 * HOUR)
        assert bookings.get(kept, a).start == FROZEN_NOW + 3 * HOUR  # read: the calendar has it
        with write(kept):  # a savepoint after it
            pass
        raise RuntimeError("rolled back")
    assert bookings.get(kept, a).start == FROZEN_NOW + HOUR
    assert_true_to_sql(kept, [a])


@pytest.mark.parametrize("undo", ["rollback", "rollback to"])
@pytest.mark.parametrize("committed", ["moved", "renumbered"])
def test_changes_committed_unread_stand_through_a_later_rollback(kept, committed, undo):
    """A change committed and not read yet (a booking moved, or cards renumbered) must still be read after a later
    transaction, or a savepoint of it, rolls back what it changed itself (another booking's notice)."""
    a = book(kept)
    b = book(kept, uuids=("GPU-bbbb",), user="bob", uid=1002, start=FROZEN_NOW + 5 * HOUR, end=FROZEN_NOW + 6 * HOUR)
    c = book(kept, start=FROZEN_NOW + 7 * HOUR, end=FROZEN_NOW + 8 * HOUR)
    assert_true_to_sql(kept, [a, b, c])
    with write(kept):
        if committed == "moved":
            bookings.set_times(kept, a, FROZEN_NOW + 2 * HOUR, FROZEN_NOW + 4 * HOUR)
        else:
            bookings.sync_cards(kept, RENUMBERED, FROZEN_NOW)
    undo_a_notice(kept, c, undo)
    assert_true_to_sql(kept, [a, b, c])
    if committed == "moved":
        assert bookings.get(kept, a).start == FROZEN_NOW + 2 * HOUR
    else:
        assert [bookings.get(kept, i).cards for i in (a, b)] == [(1,), (0,)]
    assert bookings.get(kept, c).notice is None


@pytest.mark.parametrize("when", ["changed", "loaded"])
def test_a_transaction_ended_behind_the_calendars_back_is_seen(kept, when):
    """SQLite can end a transaction itself (a full disk) before app.store.db.write tells the calendar: the next read
    sees that what the transaction changed is gone, whether the calendar read the change or was loaded with it."""
    a = book(kept)
    if when == "changed":
        assert_true_to_sql(kept, [a])
    kept.execute("BEGIN IMMEDIATE")
    bookings.set_times(kept, a, FROZEN_NOW + 3 * HOUR, FROZEN_NOW + 4 * HOUR)
    assert bookings.get(kept, a).start == FROZEN_NOW + 3 * HOUR
    kept.execute("ROLLBACK")
    assert bookings.get(kept, a).start == FROZEN_NOW + HOUR
    assert_true_to_sql(kept, [a])


# --- decoding a row: the optional columns ------------------------------------------------------------

OPTIONAL_EDITS = {  # a hand edit of a column the decoder checks only when set: what a read reports, or None (reads)
    "requested_at-text": ("UPDATE bookings SET requested_at = 'soon' WHERE id = 1", "requested_at is str 'soon'"),
    "queued-long": ("UPDATE bookings SET queued = '" + "q" * 60 + "' WHERE id = 1",
                    "queued is '" + "q" * 39 + ", not time, cards or null"),
    "queued-cards": ("UPDATE bookings SET queued = 'cards' WHERE id = 1", None),
    "queued-time": ("UPDATE bookings SET queued = 'time' WHERE id = 1", None),
    "requested_at-null": ("UPDATE bookings SET requested_at = NULL WHERE id = 1", None),
    "notice-bytes": ("UPDATE bookings SET notice = x'01' WHERE id = 1", None),
}


@pytest.mark.parametrize("edit", OPTIONAL_EDITS)
def test_a_hand_edited_optional_column_reads_as_it_should_or_is_reported(db_path, conn, edit, caplog):
    statement, problem = OPTIONAL_EDITS[edit]
    with write(conn):
        bookings.sync_cards(conn, CARDS, FROZEN_NOW)
    booking_id = book(conn)
    hand_edit(db_path, statement)
    got = bookings.get(conn, booking_id)
    if problem is not None:
        assert got is None
        assert reported(caplog) == [f"booking 1 is malformed: {problem}; skipped (a hand edit? see board doctor)"]
        return
    assert reported(caplog) == []
    assert got.queued == (edit.split("-")[1] if edit.startswith("queued") else None)
    assert got.requested_at == got.start  # NULL (a row from before the column) reads as its start
    assert got.notice is None  # a notice that is not text is none


def test_cards_recorded_before_the_fleet_are_the_reading_hosts_own(db_path, conn):
    """A card with host '' (recorded before the fleet) reads as the connection's fleet_host (the service's host), or
    '' where none is set; a card an agent claimed keeps its host."""
    with write(conn):
        bookings.sync_cards(conn, CARDS, FROZEN_NOW)
        bookings.sync_cards(conn, [CardReading(index=0, uuid="GPU-far", name="H100")], FROZEN_NOW, host="gpu2")
    mine, far = book(conn), book(conn, uuids=("GPU-far",))
    window = (FROZEN_NOW, FROZEN_NOW + 30 * HOUR)
    assert [b.host for b in bookings.live_between(conn, *window)] == ["", "gpu2"]
    conn.fleet_host = "gpu1"
    assert [b.host for b in bookings.live_between(conn, *window)] == ["gpu1", "gpu2"]
    assert [bookings.get(conn, i).host for i in (mine, far)] == ["gpu1", "gpu2"]


def test_a_booking_that_is_not_there_is_none(kept):
    assert bookings.get(kept, 99) is None  # asked of the calendar, then of SQL
    kept.calendar = None
    assert bookings.get(kept, 99) is None


def test_a_booking_reads_back_every_column_as_written(conn):
    from app.store import series

    with write(conn):
        bookings.sync_cards(conn, CARDS, FROZEN_NOW)
        series_id = series.insert(conn, user="alice", uid=1001, rule={"every": "day"}, now=FROZEN_NOW)
        booking_id = bookings.insert(
            conn, user="alice", uid=1001, uuids=["GPU-aaaa"], start=FROZEN_NOW + 2 * HOUR, end=FROZEN_NOW + 3 * HOUR,
            klass="experiment", note="", request=None, now=FROZEN_NOW, created_by=1001,
            requested_at=FROZEN_NOW + HOUR, queued="cards", series_id=series_id)
        plain = book(conn, start=FROZEN_NOW + 4 * HOUR, end=FROZEN_NOW + 5 * HOUR)
        bookings.set_notice(conn, plain, "moved by the backfill")
    got = bookings.get(conn, booking_id)
    assert (got.requested_at, got.queued, got.series_id, got.request, got.notice) == (
        FROZEN_NOW + HOUR, "cards", series_id, None, None)
    assert conn.execute("SELECT request FROM bookings WHERE id = ?", (booking_id,)).fetchone() == (None,)
    other = bookings.get(conn, plain)  # requested_at defaults to the start; no queue, no series
    assert (other.requested_at, other.queued, other.series_id, other.notice) == (
        FROZEN_NOW + 4 * HOUR, None, None, "moved by the backfill")
    # stored, not only read so: the alerts' queue wait reads the column in SQL (app.alerts.engine)
    assert conn.execute("SELECT requested_at FROM bookings WHERE id = ?", (plain,)).fetchone() == (FROZEN_NOW + 4 * HOUR,)


def test_queued_lists_the_live_queued_bookings_not_started_in_start_order(conn):
    with write(conn):
        bookings.sync_cards(conn, CARDS, FROZEN_NOW)
    late = book(conn, start=FROZEN_NOW + 5 * HOUR, end=FROZEN_NOW + 6 * HOUR)
    early = book(conn, uuids=("GPU-bbbb",), start=FROZEN_NOW + 2 * HOUR, end=FROZEN_NOW + 3 * HOUR)
    started = book(conn, uuids=("GPU-bbbb",), start=FROZEN_NOW - HOUR, end=FROZEN_NOW + HOUR)
    cancelled = book(conn, start=FROZEN_NOW + 7 * HOUR, end=FROZEN_NOW + 8 * HOUR)
    book(conn, start=FROZEN_NOW + 9 * HOUR, end=FROZEN_NOW + 10 * HOUR)  # not queued
    with write(conn):
        for booking_id, how in ((late, "time"), (early, "cards"), (started, "time"), (cancelled, "time")):
            bookings.set_queued(conn, booking_id, how)
        bookings.set_cancelled(conn, cancelled)
    conn.fleet_host = "gpu1"  # the cards were recorded before the fleet: this host's
    assert [(b.id, b.queued, b.host) for b in bookings.queued(conn, FROZEN_NOW)] == [
        (early, "cards", "gpu1"), (late, "time", "gpu1")]
    assert [b.id for b in bookings.queued(conn, FROZEN_NOW + 2 * HOUR)] == [late]  # starts exactly then: started


def test_live_servers_are_those_starting_ready_or_stopping(conn):
    with write(conn):
        bookings.sync_cards(conn, CARDS, FROZEN_NOW)
    mine, other = book(conn), book(conn, uuids=("GPU-bbbb",))

    def add(booking_id, state, port):
        with write(conn):
            return conn.execute(
                'INSERT INTO servers (booking_id, "user", uid, cards, card_uuids, model, host, port, cmdline, state,'
                " created_at) VALUES (?, 'alice', 1001, '[]', '[]', '/m.gguf', '127.0.0.1', ?, '[]', ?, ?)",
                (booking_id, port, state, FROZEN_NOW)).lastrowid

    for port, state in enumerate(("stopped", "crashed", "failed"), 8100):
        add(mine, state, port)
    assert (bookings.any_live_server(conn), bookings.live_server_ids(conn, mine)) == (False, [])
    live = [add(mine, state, port) for port, state in enumerate(("stopping", "ready", "starting"), 8200)]
    add(other, "ready", 8300)
    assert (bookings.any_live_server(conn), bookings.live_server_ids(conn, mine)) == (True, live)


def test_a_rollback_to_a_savepoint_on_a_connection_without_a_calendar_is_told_to_none(conn):
    with write(conn):
        bookings.sync_cards(conn, CARDS, FROZEN_NOW)
    a = book(conn)
    with write(conn, savepoint="attempt"):  # as the service's refusals do, on PostgreSQL too (no calendar there)
        bookings.set_notice(conn, a, "undone")
        conn.execute("ROLLBACK TO attempt")
        bookings.rolled_back(conn)
    assert bookings.get(conn, a).notice is None


@pytest.mark.parametrize("undo", ["rollback", "rollback to"])
def test_a_calendar_not_read_yet_takes_a_rollback_before_its_first_read(conn, kept, undo):
    """The first transaction on a service's connection may roll back (or roll back to its savepoint) before anything
    reads the calendar: the calendar still loads at its first read."""
    a = book(conn)  # by another connection: `kept` has had no transaction yet
    undo_a_notice(kept, a, undo)
    assert_true_to_sql(kept, [a])
    assert bookings.get(kept, a).notice is None


def test_inside_a_transaction_each_read_reads_again_only_the_changes_since_the_last(kept):
    a = book(kept)
    b = book(kept, uuids=("GPU-bbbb",), user="bob", uid=1002)
    answers(kept, [a, b])
    with write(kept):
        bookings.set_notice(kept, a, "one")
        read = bookings_read(kept, lambda: answers(kept, [a, b]))
        assert len(read) == 1 and f"where b.id = {a} " in read[0].lower()
        bookings.set_notice(kept, b, "two")
        read = bookings_read(kept, lambda: answers(kept, [a, b]))
        assert len(read) == 1 and f"where b.id = {b} " in read[0].lower()
    assert kept.calendar.longest == HOUR  # the longest booking's seconds: how far back a user's search starts


def test_the_calendar_reads_cards_recorded_before_the_fleet_as_the_connections_host(kept):
    a = book(kept)
    kept.fleet_host = "gpu1"
    assert bookings.get(kept, a).host == "gpu1"
    assert_true_to_sql(kept, [a])


def test_busy_leaves_out_the_excluded_booking_and_what_ended_before_the_window(kept):
    spans = [(1, 2), (3, 4), (5, 6)]
    x, y, z = (book(kept, start=FROZEN_NOW + s * HOUR, end=FROZEN_NOW + e * HOUR) for s, e in spans)
    for question in (lambda c: bookings.busy_by_card(c, FROZEN_NOW + 3 * HOUR, excluding=y),
                     lambda c: bookings.busy_by_card(c, FROZEN_NOW + 2 * HOUR, FROZEN_NOW + 5 * HOUR, excluding=x)):
        from_memory = question(kept)
        calendar, kept.calendar = kept.calendar, None
        assert from_memory == question(kept)
        kept.calendar = calendar
    assert bookings.busy_by_card(kept, FROZEN_NOW + 3 * HOUR, excluding=y) == {
        "GPU-aaaa": [(FROZEN_NOW + 5 * HOUR, FROZEN_NOW + 6 * HOUR)]}
    assert bookings.busy_by_card(kept, FROZEN_NOW + 4 * HOUR, FROZEN_NOW + 5 * HOUR, excluding=z) == {}

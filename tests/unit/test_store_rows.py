"""Store rows on a real SQLite file: what each query returns, what a hand-edited row reports, the audit chain."""

from __future__ import annotations


import pytest

from app.gpu.model import CardReading
from app.store import bookings, events
from app.store.db import connect, is_postgres, write
from tests.conftest import FROZEN_NOW, sqlite_only
from tests.safety.test_malformed_rows import hand_edit

HOUR = 3600
CARDS = [CardReading(index=0, uuid="GPU-aaaa", name="H100"), CardReading(index=1, uuid="GPU-bbbb", name="H100")]


def book(conn, uuids=("GPU-aaaa",), start=FROZEN_NOW + HOUR, end=FROZEN_NOW + 2 * HOUR, user="alice", **kw):
    with write(conn):
        return bookings.insert(conn, user=user, uid=kw.pop("uid", 1001), uuids=list(uuids), start=start, end=end,
                               klass="experiment", note=kw.pop("note", ""), request=kw.pop("request", None),
                               now=kw.pop("now", FROZEN_NOW), created_by=1001)


@pytest.fixture
def cards(conn):
    with write(conn):
        bookings.sync_cards(conn, CARDS, FROZEN_NOW)
    return conn


def reported(caplog) -> list[str]:
    """The malformed-row lines logged during this test."""
    return [r.getMessage() for r in caplog.records if " is malformed: " in r.getMessage()]


# --- bookings: reading rows back -----------------------------------------------------------------


def test_a_booking_reads_back_as_written(cards):
    booking_id = book(cards, uuids=["GPU-bbbb", "GPU-aaaa"], note="n", request={"count": 2}, now=FROZEN_NOW - 60)
    got = bookings.get(cards, booking_id)
    assert (got.user, got.uid, got.start, got.end, got.klass, got.note, got.status) == (
        "alice", 1001, FROZEN_NOW + HOUR, FROZEN_NOW + 2 * HOUR, "experiment", "n", "booked")
    assert got.created_at == FROZEN_NOW - 60
    assert got.request == {"count": 2}
    assert (got.cards, got.card_uuids) == ((0, 1), ("GPU-aaaa", "GPU-bbbb"))


def test_a_booking_on_cards_10_and_2_reads_back_in_card_order_from_sql_and_memory(conn, db_path):
    """Card 10 sorts before card 2 as text: a booking on both names them 2 then 10, with their UUIDs in that order,
    from SQL (both stores) and from the calendar in memory, whichever order they were booked in.

    Wrong versions it fails on: the cards sorted by their index as text; by UUID; in the order written."""
    with write(conn):
        bookings.sync_cards(conn, [CardReading(index=10, uuid="GPU-aaaa"), CardReading(index=2, uuid="GPU-zzzz")],
                            FROZEN_NOW)
    made = book(conn, uuids=["GPU-aaaa", "GPU-zzzz"])
    readers = [conn]
    if not is_postgres(conn):
        readers.append(connect(db_path))
        bookings.keep_calendar(readers[-1], FROZEN_NOW - 86400)
    for reader in readers:
        for got in (bookings.get(reader, made), *bookings.live_between(reader, FROZEN_NOW, FROZEN_NOW + 3 * HOUR)):
            assert (got.id, got.cards, got.card_uuids) == (made, (2, 10), ("GPU-zzzz", "GPU-aaaa"))
    for reader in readers[1:]:
        reader.close()


def test_a_card_uuid_with_spaces_reads_back_exactly(conn):
    odd = " GPU odd one"  # a hand-added card; the decoder must not split or strip it
    with write(conn):
        bookings.sync_cards(conn, [CardReading(index=3, uuid=odd)], FROZEN_NOW)
    booking_id = book(conn, uuids=[odd])
    got = bookings.get(conn, booking_id)
    assert (got.cards, got.card_uuids) == ((3,), (odd,))


def test_listing_with_no_filter_returns_everything(cards):
    first = book(cards, start=FROZEN_NOW + 5 * HOUR, end=FROZEN_NOW + 6 * HOUR)
    second = book(cards, uuids=["GPU-bbbb"], user="bob")
    with write(cards):
        bookings.set_cancelled(cards, first)
    everything = bookings.listing(cards, start=None, end=None, user=None, include_cancelled=True)
    assert [b.id for b in everything] == [second, first]
    assert [b.id for b in bookings.listing(cards, start=None, end=None, user=None, include_cancelled=False)] == [
        second]


def test_listing_filters_by_window_and_user(cards):
    early = book(cards, start=FROZEN_NOW + HOUR, end=FROZEN_NOW + 2 * HOUR)
    late = book(cards, start=FROZEN_NOW + 5 * HOUR, end=FROZEN_NOW + 6 * HOUR)
    bobs = book(cards, uuids=["GPU-bbbb"], user="bob", start=FROZEN_NOW + 3 * HOUR, end=FROZEN_NOW + 4 * HOUR)

    def ids(**kw):
        query = dict(start=None, end=None, user=None, include_cancelled=False) | kw
        return [b.id for b in bookings.listing(cards, **query)]

    assert ids(start=FROZEN_NOW + 2 * HOUR) == [bobs, late]  # ends exactly at start: not listed
    assert ids(end=FROZEN_NOW + 3 * HOUR) == [early]  # starts exactly at end: not listed
    assert ids(start=FROZEN_NOW + 2 * HOUR, end=FROZEN_NOW + 5 * HOUR, user="alice") == []
    assert ids(start=FROZEN_NOW, end=FROZEN_NOW + 6 * HOUR, user="alice") == [early, late]
    assert ids(user="bob") == [bobs]


def test_busy_by_card_stops_at_before(cards):
    book(cards, start=FROZEN_NOW + HOUR, end=FROZEN_NOW + 2 * HOUR)
    book(cards, start=FROZEN_NOW + 5 * HOUR, end=FROZEN_NOW + 6 * HOUR)
    assert bookings.busy_by_card(cards, FROZEN_NOW, FROZEN_NOW + 3 * HOUR) == {
        "GPU-aaaa": [(FROZEN_NOW + HOUR, FROZEN_NOW + 2 * HOUR)]}
    assert bookings.busy_by_card(cards, FROZEN_NOW)["GPU-aaaa"] == [
        (FROZEN_NOW + HOUR, FROZEN_NOW + 2 * HOUR), (FROZEN_NOW + 5 * HOUR, FROZEN_NOW + 6 * HOUR)]


@sqlite_only  # SQLite's total_changes counts the writes
def test_syncing_unchanged_cards_writes_nothing(cards):
    before = cards.total_changes
    with write(cards):
        bookings.sync_cards(cards, CARDS, FROZEN_NOW + HOUR)
    assert cards.total_changes == before
    assert cards.execute("SELECT seen_at FROM cards").fetchall() == [(FROZEN_NOW,), (FROZEN_NOW,)]
    with write(cards):
        bookings.sync_cards(cards, [CardReading(index=5, uuid="GPU-aaaa", name="H100")], FROZEN_NOW + HOUR)
    assert cards.execute("SELECT idx, seen_at FROM cards WHERE uuid = 'GPU-aaaa'").fetchone() == (5, FROZEN_NOW + HOUR)
    assert cards.execute("SELECT seen_at FROM cards WHERE uuid = 'GPU-bbbb'").fetchone() == (FROZEN_NOW,)


# --- bookings: a hand-edited row is reported, naming what is wrong --------------------------------

EDITS = {
    "user": ("UPDATE bookings SET user = x'00ff' WHERE id = 1", "user is bytes b'\\x00\\xff'"),
    "uid": ("UPDATE bookings SET uid = 1.5 WHERE id = 1", "uid is float 1.5"),
    "starts_at": ("UPDATE bookings SET starts_at = 'soon' WHERE id = 1", "starts_at is str 'soon'"),
    "ends_at": ("UPDATE bookings SET ends_at = 'later' WHERE id = 1", "ends_at is str 'later'"),
    "class": ("UPDATE bookings SET class = x'01' WHERE id = 1", "class is bytes b'\\x01'"),
    "note": ("UPDATE bookings SET note = x'02' WHERE id = 1", "note is bytes b'\\x02'"),
    "status": ("UPDATE bookings SET status = x'03' WHERE id = 1", "status is bytes b'\\x03'"),
    "created_at": ("UPDATE bookings SET created_at = 'then' WHERE id = 1", "created_at is str 'then'"),
    "request-bytes": ("UPDATE bookings SET request = x'7b7d' WHERE id = 1", "request is bytes b'{}'"),
    "status-long": ("UPDATE bookings SET status = '" + "z" * 60 + "' WHERE id = 1",
                    "status is '" + "z" * 39 + ", not booked or cancelled"),
    "ends-as-it-starts": ("UPDATE bookings SET ends_at = starts_at WHERE id = 1",
                          f"it ends ({FROZEN_NOW + HOUR}) before it starts ({FROZEN_NOW + HOUR})"),
    "no-cards": ("DELETE FROM booking_cards WHERE booking_id = 1", "it has no cards"),
    "card-nowhere": ("UPDATE booking_cards SET card_uuid = 'GPU-" + "n" * 70 + "' WHERE booking_id = 1",
                     "its card 'GPU-" + "n" * 55 + " is not in the cards table"),
    "request-not-json": ("UPDATE bookings SET request = '{" + "x" * 60 + "' WHERE id = 1",
                         "request is not JSON ('{" + "x" * 38 + ")"),
    "request-a-list": ("UPDATE bookings SET request = '[1, 2]' WHERE id = 1", "request is JSON list, not an object"),
    "card-index-not-a-number": ("UPDATE cards SET idx = 'one' WHERE uuid = 'GPU-aaaa'",
                                "invalid literal for int() with base 10: 'one'"),
}


@sqlite_only  # hand edits through SQLite's own file (PostgreSQL's types refuse most)
@pytest.mark.parametrize("edit", EDITS)
def test_a_hand_edited_booking_is_reported_with_its_fault_and_skipped(db_path, cards, edit, caplog):
    statement, problem = EDITS[edit]
    book(cards)
    good = book(cards, uuids=["GPU-bbbb"])
    hand_edit(db_path, statement)
    assert bookings.get(cards, 1) is None
    assert [b.id for b in bookings.listing(cards, start=None, end=None, user=None, include_cancelled=True)] == [good]
    assert [b.id for b in bookings.live_between(cards, FROZEN_NOW, FROZEN_NOW + 3 * HOUR)] == [good]
    assert reported(caplog) == [f"booking 1 is malformed: {problem}; skipped (a hand edit? see board doctor)"]


@pytest.mark.parametrize("read", ["get", "listing", "live_between"])
def test_each_database_reports_its_own_malformed_rows(tmp_path, read, caplog):
    # The same booking id broken in two files is two reports, one per file.
    for name in ("one.db", "two.db"):
        conn = connect(tmp_path / name)
        with write(conn):
            bookings.sync_cards(conn, CARDS, FROZEN_NOW)
        book(conn)
        hand_edit(tmp_path / name, "DELETE FROM booking_cards WHERE booking_id = 1")
        if read == "get":
            assert bookings.get(conn, 1) is None
        elif read == "listing":
            assert bookings.listing(conn, start=None, end=None, user=None, include_cancelled=True) == []
        else:
            assert bookings.live_between(conn, FROZEN_NOW, FROZEN_NOW + 3 * HOUR) == []
        conn.close()
    assert [line.split(":")[0] for line in reported(caplog)] == ["booking 1 is malformed"] * 2


# --- events ---------------------------------------------------------------------------------------


def record(conn, n, **kw):
    fields = dict(ts=FROZEN_NOW + n, uid=1001, actor="alice", action="create", booking_id=n, ok=True,
                  details={"n": n})
    fields.update(kw)
    events.record(conn, **fields)


def test_recent_is_newest_first_limited_and_filtered(conn):
    with write(conn):
        for n in range(1, 103):
            record(conn, n, booking_id=n % 3)
    latest = events.recent(conn)
    assert len(latest) == 100
    assert [e.id for e in latest[:2]] == [102, 101]
    newest = latest[0]
    assert (newest.ts, newest.uid, newest.actor, newest.action, newest.booking_id, newest.ok, newest.details) == (
        FROZEN_NOW + 102, 1001, "alice", "create", 0, True, {"n": 102})
    assert [e.id for e in events.recent(conn, limit=3, booking_id=1)] == [100, 97, 94]


def test_a_chain_verifies_with_the_hashes_of_this_format(conn):
    # Logs already on disk must keep verifying: the hash of a known event is fixed.
    with write(conn):
        events.record(conn, ts=FROZEN_NOW, uid=1001, actor="zoë", action="create", booking_id=7, ok=True,
                      details={"note": "café", "a": 1})
    details, stored = conn.execute("SELECT details, hash FROM events").fetchone()
    assert details == '{"a": 1, "note": "café"}'
    assert stored == "aaea8d3088f899e9a8c22f62672941269f00a961bb6f1c2ff8abd66c7b28c15a"
    assert events.first_broken(conn) is None


def test_an_actor_sqlite_cannot_store_is_refused_before_any_write(conn):
    with pytest.raises(UnicodeEncodeError):
        with write(conn):
            record(conn, 1, actor="al\udce9ice")
    assert events.recent(conn) == []


@pytest.fixture
def chain(db_path, conn):
    with write(conn):
        for n in range(1, 7):
            record(conn, n)
    assert events.first_broken(conn) is None
    return conn


@sqlite_only  # hand edits through SQLite's own file (PostgreSQL's types refuse most)
def test_removing_the_first_rows_breaks_the_chain_at_row_1(db_path, chain):
    hand_edit(db_path, "DROP TRIGGER events_no_delete", "DELETE FROM events WHERE id <= 2")
    assert events.first_broken(chain) == 1


@sqlite_only  # hand edits through SQLite's own file (PostgreSQL's types refuse most)
def test_removing_rows_in_the_middle_names_the_first_missing_id(db_path, chain):
    hand_edit(db_path, "DROP TRIGGER events_no_delete", "DELETE FROM events WHERE id IN (3, 4)")
    assert events.first_broken(chain) == 3


@sqlite_only  # hand edits through SQLite's own file (PostgreSQL's types refuse most)
def test_an_edited_row_given_a_recomputed_hash_is_named(db_path, chain):
    # Row 3 edited and its own hash recomputed: row 4's link no longer matches, but row 4 itself is intact.
    prev = chain.execute("SELECT hash FROM events WHERE id = 2").fetchone()[0]
    forged = events._digest(prev, FROZEN_NOW + 3, 1001, "mallory", "create", 3, True, '{"n": 3}')
    hand_edit(db_path, "DROP TRIGGER events_no_update",
              f"UPDATE events SET actor = 'mallory', hash = '{forged}' WHERE id = 3")
    assert events.first_broken(chain) == 3


@sqlite_only  # hand edits through SQLite's own file (PostgreSQL's types refuse most)
def test_an_edited_link_names_its_own_row(db_path, chain):
    hand_edit(db_path, "DROP TRIGGER events_no_update", f"UPDATE events SET prev_hash = '{'1' * 64}' WHERE id = 4")
    assert events.first_broken(chain) == 4


# --- the calendar in memory ----------------------------------------------------------------------


@sqlite_only  # the calendar in memory is SQLite's alone
def test_the_calendar_answers_as_the_sql_through_changes_rollbacks_and_other_writers(db_path, cards):
    """The service keeps the live bookings in memory on its connection (keep_calendar); each answer is the SQL's on
    that same connection, after its own changes, a savepoint rolled back, a transaction rolled back, a commit by
    another connection (another process on a file-mode database) and cards renumbered after a reboot."""
    kept = connect(db_path)
    calendar = bookings.keep_calendar(kept, FROZEN_NOW - 86400)
    other = cards  # another connection to the same file

    def same() -> None:
        asked = 0
        for start, end in ((FROZEN_NOW, FROZEN_NOW + 20 * HOUR), (FROZEN_NOW + 2 * HOUR, FROZEN_NOW + 3 * HOUR),
                           (FROZEN_NOW + 4 * HOUR, FROZEN_NOW + 5 * HOUR)):
            for question in (lambda c: bookings.live_between(c, start, end),
                             lambda c: bookings.live_between(c, start, end, user="bob"),
                             lambda c: bookings.busy_by_card(c, start, end),
                             lambda c: bookings.busy_by_card(c, start),
                             lambda c: bookings.busy_by_card(c, start, end, excluding=1),
                             lambda c: bookings.first_conflict(c, ["GPU-aaaa", "GPU-bbbb"], start, end),
                             lambda c: bookings.first_conflict(c, ["GPU-bbbb"], start, end, excluding=2)):
                from_memory = question(kept)
                kept.calendar = None  # the same question to SQL, on the same connection (inside its transaction)
                try:
                    assert from_memory == question(kept)
                finally:
                    kept.calendar = calendar
                asked += 1
        assert asked == 21

    same()
    a = book(kept, start=FROZEN_NOW + HOUR, end=FROZEN_NOW + 3 * HOUR)
    same()
    b = book(other, uuids=("GPU-aaaa", "GPU-bbbb"), user="bob", uid=1002, start=FROZEN_NOW + 4 * HOUR,
             end=FROZEN_NOW + 6 * HOUR)
    same()
    assert [x.id for x in bookings.live_between(kept, FROZEN_NOW, FROZEN_NOW + 20 * HOUR)] == [a, b]
    with write(kept):
        bookings.set_times(kept, a, FROZEN_NOW + 2 * HOUR, FROZEN_NOW + 4 * HOUR)
        same()
        kept.execute("SAVEPOINT attempt")
        bookings.set_cancelled(kept, a)
        same()
        kept.execute("ROLLBACK TO attempt")
        bookings.rolled_back(kept)
        same()
        bookings.set_owner(kept, a, "bob", 1002)
        bookings.set_cards(kept, a, ["GPU-bbbb"])
        same()
    same()
    with pytest.raises(RuntimeError), write(kept):
        bookings.set_cancelled(kept, b)
        same()
        raise RuntimeError("rolled back")
    same()
    assert {x.id for x in bookings.live_between(kept, FROZEN_NOW, FROZEN_NOW + 20 * HOUR)} == {a, b}
    with write(other):  # a reboot renumbers the cards: a booking names them by index
        bookings.sync_cards(other, [CardReading(index=1, uuid="GPU-aaaa", name="H100"),
                                    CardReading(index=0, uuid="GPU-bbbb", name="H100")], FROZEN_NOW)
        bookings.set_queued(other, b, "time")
    same()
    with write(kept):
        bookings.sync_cards(kept, CARDS, FROZEN_NOW)
        same()
    same()
    assert bookings.live_between(kept, FROZEN_NOW, FROZEN_NOW + 20 * HOUR)[1].cards == (0, 1)
    # Older than the calendar keeps: SQL answers.
    old = book(kept, start=FROZEN_NOW - 3 * 86400, end=FROZEN_NOW - 2 * 86400)
    assert [x.id for x in bookings.live_between(kept, FROZEN_NOW - 4 * 86400, FROZEN_NOW)] == [old]
    kept.close()

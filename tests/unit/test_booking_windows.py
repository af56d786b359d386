"""Every window over the bookings (app.store.bookings, the calendar in memory, app.service.fleet.lastknown) at its edges: a
booking that began before the window and runs through it is in it; one that ends exactly at the window's start and
one that starts exactly at its end are not (half-open [start, end)). The SQL on both stores, the calendar in memory
(SQLite's) and the bookings the service last read (while PostgreSQL is unreachable) give the same answer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.errors import BoardError
from app.gpu.model import CardReading
from app.service.fleet import lastknown
from app.store import bookings
from app.store.db import connect, is_postgres, write
from tests.conftest import FROZEN_NOW
from tests.unit.test_store_rows import HOUR, book

# The window: the afternoon after tomorrow, clear of the calendar's `since` (a day before FROZEN_NOW).
START, END = FROZEN_NOW + 30 * HOUR, FROZEN_NOW + 34 * HOUR
SINCE = FROZEN_NOW - 24 * HOUR
HOST = "gpu1"
# Card 10 before card 2 as text, after it as numbers; gpu2's card is another host's.
CARDS = [CardReading(index=2, uuid="GPU-2222", name="H100"), CardReading(index=10, uuid="GPU-1010", name="H100")]
THEIRS = CardReading(index=0, uuid="GPU-0000", name="H100")


@pytest.fixture
def spans(conn):
    """The window's neighbours, by name: their ids. `through` is the longest booking and began before the calendar's
    `since` (a long run, booked days ago); alice's and bob's bookings on card 10 touch the window at its edges."""
    with write(conn):
        bookings.sync_cards(conn, CARDS, FROZEN_NOW, HOST)
        bookings.sync_cards(conn, [THEIRS], FROZEN_NOW, "gpu2")
    cancelled = book(conn, uuids=["GPU-1010"], start=START - HOUR, end=END + HOUR)
    with write(conn):
        bookings.set_cancelled(conn, cancelled)
    return {
        "cancelled_through": cancelled,
        "through": book(conn, uuids=["GPU-2222"], start=FROZEN_NOW - 30 * HOUR, end=END + 2 * HOUR),
        "ends_at_start": book(conn, uuids=["GPU-1010"], start=START - 2 * HOUR, end=START),
        "starts_at_end": book(conn, uuids=["GPU-1010"], start=END, end=END + HOUR),
        "inside": book(conn, uuids=["GPU-1010"], user="bob", uid=1002, start=START + HOUR, end=START + 2 * HOUR),
        "bob_before": book(conn, uuids=["GPU-2222", "GPU-0000"], user="bob", uid=1002, start=FROZEN_NOW - 40 * HOUR,
                           end=FROZEN_NOW - 30 * HOUR),
        "theirs_through": book(conn, uuids=["GPU-0000"], user="bob", uid=1002, start=START - HOUR, end=END + HOUR),
    }


def named(spans, found) -> list[str]:
    ids = {booking_id: name for name, booking_id in spans.items()}
    return [ids[b.id] for b in found]


def sql_and_memory(conn, db_path):
    """The connections that answer: the test's own (SQL), and on SQLite a second one keeping the calendar in memory."""
    if is_postgres(conn):
        return [conn]
    kept = connect(db_path)
    bookings.keep_calendar(kept, SINCE)
    return [conn, kept]


def test_a_window_holds_what_runs_through_it_and_not_what_touches_its_edges(conn, db_path, spans):
    """Each window query, from SQL on both stores and from the calendar in memory, with the expected names.

    Wrong versions it fails on: `starts_at >= start` for `ends_at > start` (the booking that began before is lost);
    `ends_at >= start` or `starts_at <= end` (the ones touching an edge come in); the calendar looking back for a
    user only from the window's start (not the longest booking's length before it), or loading only what started
    after `since`; the span just before the window taken in when it ends at the start."""
    for reader in sql_and_memory(conn, db_path):
        assert named(spans, bookings.live_between(reader, START, END)) == ["through", "theirs_through", "inside"]
        assert named(spans, bookings.live_between(reader, START, END, user="alice")) == ["through"]
        assert named(spans, bookings.live_between(reader, START, END, user="bob")) == ["theirs_through", "inside"]
        assert bookings.busy_by_card(reader, START, END) == {
            "GPU-2222": [(FROZEN_NOW - 30 * HOUR, END + 2 * HOUR)], "GPU-1010": [(START + HOUR, START + 2 * HOUR)],
            "GPU-0000": [(START - HOUR, END + HOUR)]}
        assert bookings.busy_by_card(reader, START, END, excluding=spans["inside"]) == {
            "GPU-2222": [(FROZEN_NOW - 30 * HOUR, END + 2 * HOUR)], "GPU-0000": [(START - HOUR, END + HOUR)]}
        assert named(spans, [bookings.first_conflict(reader, ["GPU-1010", "GPU-2222"], START, END)]) == ["inside"]
        assert named(spans, [bookings.first_conflict(reader, ["GPU-2222"], START, END)]) == ["through"]
        assert bookings.first_conflict(reader, ["GPU-1010"], START, START + HOUR) is None  # between its neighbours
        assert bookings.first_conflict(reader, ["GPU-1010"], START + 2 * HOUR, END) is None
        # A window that ends where the long one's neighbour on card 2 ended: only that edge touches.
        assert named(spans, bookings.live_between(reader, FROZEN_NOW - 30 * HOUR, FROZEN_NOW - 30 * HOUR + 1)) == [
            "through"]
    for reader in sql_and_memory(conn, db_path)[1:]:
        reader.close()


def test_the_listing_and_the_calendar_say_the_same_of_the_window(conn, db_path, spans):
    """`board list --from --to` (and so `board ical`'s window) reads `listing`, the board's window `live_between`: for
    the same window, per user too, they name the same bookings, cancelled ones aside.

    Wrong versions it fails on: the listing's `starts_at >= start`; its `ends_at >= start`; the two disagreeing."""
    for reader in sql_and_memory(conn, db_path):
        for user in (None, "alice", "bob"):
            listed = bookings.listing(reader, start=START, end=END, user=user, include_cancelled=False)
            assert listed == bookings.live_between(reader, START, END, user=user), user
        everything = bookings.listing(reader, start=START, end=END, user="alice", include_cancelled=True)
        assert named(spans, everything) == ["through", "cancelled_through"]
        assert named(spans, bookings.listing(reader, start=START, end=None, user="alice", include_cancelled=False)) == [
            "through", "starts_at_end"]
        assert named(spans, bookings.listing(reader, start=None, end=START, user="bob", include_cancelled=False)) == [
            "bob_before", "theirs_through"]
    for reader in sql_and_memory(conn, db_path)[1:]:
        reader.close()


def test_the_bookings_last_read_answer_a_window_as_the_database(conn, spans):
    """While a PostgreSQL database is unreachable the board's window and `list` answer from the bookings the service
    last read (app.service.fleet.lastknown): for the same window, the same bookings as the SQL; `list`, this host's only.

    Wrong versions it fails on: `start >= window start` for `end > window start` in memory; `start <= end` at the
    end; the other host's booking listed as this host's."""
    read_at = FROZEN_NOW - 30 * HOUR + 1  # the long booking had begun; bob's earlier one had just ended
    live = bookings.live_between(conn, int(read_at), lastknown.FOREVER)
    known = lastknown.Known(read_at, tuple(live), ())
    assert known.between(START, END) == bookings.live_between(conn, START, END)
    assert [b.id for b in known.between(START, END)] == [spans[n] for n in ("through", "theirs_through", "inside")]
    service = SimpleNamespace(known=known, host=HOST, clock=lambda: read_at)
    away = BoardError("the board database is unreachable (gpu1 → /run/postgresql:5432); nothing was changed")
    for user in (None, "alice", "bob"):
        found, stale_since = lastknown.listing(service, away, start=START, end=END, user=user, include_cancelled=False)
        assert stale_since == read_at
        assert found == [b for b in bookings.listing(conn, start=START, end=END, user=user, include_cancelled=False)
                         if b.host == HOST], user
    found, _ = lastknown.listing(service, away, start=START, end=END, user=None, include_cancelled=False)
    assert [b.id for b in found] == [spans["through"], spans["inside"]]

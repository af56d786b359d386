"""Property: whatever sequence of bookings, extensions and cancellations is tried, no card ever holds two
overlapping live bookings, and every refusal leaves the database as it was."""

import sqlite3

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config import Config, Policy
from app.service.bookings import BookingService
from app.errors import BoardError
from app.core.identity import Identity
from app.gpu import open_source
from app.store.db import connect
from tests.conftest import FROZEN_NOW

FLEET = open_source(True, clock=lambda: FROZEN_NOW).read()
CONFIG = Config(policy=Policy(max_booking_hours=1000, max_ahead_days=1000, max_cards_per_user=64))
PEOPLE = [Identity("alice", 1001, False), Identity("bob", 1002, False), Identity("root", 0, True)]
Q = 900  # quarter-hour grid so that edges meet often

create = st.tuples(
    st.just("create"), st.sampled_from(PEOPLE),
    st.one_of(st.lists(st.integers(0, 7), min_size=1, max_size=4), st.sampled_from([1, 2, 4, 8])),
    st.integers(0, 40), st.integers(1, 16),
)
change = st.tuples(st.sampled_from(["extend", "cancel", "release", "reassign"]), st.sampled_from(PEOPLE),
                   st.integers(1, 30), st.integers(0, 40), st.integers(1, 16))


def overlapping_pairs(conn: sqlite3.Connection) -> list:
    return conn.execute(
        "SELECT a.booking_id, b.booking_id FROM booking_cards a JOIN booking_cards b"
        " ON a.card_uuid = b.card_uuid AND a.booking_id < b.booking_id"
        " JOIN bookings x ON x.id = a.booking_id JOIN bookings y ON y.id = b.booking_id"
        " WHERE x.status = 'booked' AND y.status = 'booked'"
        " AND x.starts_at < y.ends_at AND y.starts_at < x.ends_at"
    ).fetchall()


def snapshot(conn):
    return (conn.execute("SELECT * FROM bookings ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM booking_cards ORDER BY booking_id, card_uuid").fetchall())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.one_of(create, change), min_size=1, max_size=25), tick=st.integers(0, 8))
def test_accepted_bookings_never_overlap(tmp_path_factory, steps, tick):
    conn = connect(tmp_path_factory.mktemp("prop") / "board.db")
    accepted = 0
    for n, (verb, who, target, a, b) in enumerate(steps):
        now = FROZEN_NOW + tick * n * Q
        service = BookingService(conn, who, CONFIG, FLEET.cards, FLEET.topology, lambda: now)
        before = snapshot(conn)
        try:
            if verb == "create":
                start = FROZEN_NOW + a * Q
                cards, count = (target, None) if isinstance(target, list) else (None, target)
                service.create(cards=cards, count=count, start=start, end=start + b * Q)
            elif verb == "extend":
                service.extend(target, FROZEN_NOW + (a + b) * Q)
            elif verb == "reassign":
                service.reassign(target, cards=[(a + i) % 8 for i in range(b % 3 + 1)])
            else:
                getattr(service, verb)(target)
            accepted += 1
        except BoardError:
            assert snapshot(conn) == before  # a refusal changes no booking
        assert overlapping_pairs(conn) == []
    conn.close()


def test_the_overlap_trigger_stops_a_writer_that_bypasses_the_app(make_service, conn):
    import pytest

    make_service().create(cards=[0], start=FROZEN_NOW, end=FROZEN_NOW + 3600)
    conn.execute("INSERT INTO bookings (user, uid, starts_at, ends_at, created_at, created_by)"
                 " VALUES ('eve', 9, ?, ?, 0, 9)", (FROZEN_NOW + 1800, FROZEN_NOW + 7200))
    uuid = FLEET.cards[0].uuid
    with pytest.raises(sqlite3.IntegrityError, match="overlapping booking"):
        conn.execute("INSERT INTO booking_cards (card_uuid, booking_id) VALUES (?, 2)", (uuid,))
    # and an update that would stretch a booking over another one
    conn.execute("INSERT INTO booking_cards (card_uuid, booking_id) VALUES (?, 2)", (FLEET.cards[1].uuid,))
    make_service().create(cards=[1], start=FROZEN_NOW + 7200, end=FROZEN_NOW + 9000)
    with pytest.raises(sqlite3.IntegrityError, match="overlapping booking"):
        conn.execute("UPDATE bookings SET ends_at = ? WHERE id = 2", (FROZEN_NOW + 8000,))
    assert overlapping_pairs(conn) == []

"""Property: whatever sequence of bookings, extensions, cancellations and moves is tried, no card ever holds two
overlapping live bookings, nobody holds more cards at once than the limit, and every refusal leaves the database as
it was. The steps aim at existing bookings and shared edges, so that a good share of them is accepted: a service
that refused everything would pass the invariants alone."""

import sqlite3
from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.config import Config, Policy
from app.service.rules.bookings import BookingService
from app.errors import BoardError
from app.core.identity import Identity
from app.gpu import open_source
from app.store import bookings as rows
from app.store.db import connect
from tests.conftest import FROZEN_NOW

FLEET = open_source(True, clock=lambda: FROZEN_NOW).read()
LIMIT = 4  # cards per user at once: small, so that steps run into it
CONFIG = Config(policy=Policy(max_booking_hours=1000, max_ahead_days=1000, max_cards_per_user=LIMIT))
PEOPLE = [Identity("alice", 1001, False), Identity("bob", 1002, False), Identity("root", 0, True)]
ALICE, BOB, ROOT = PEOPLE
Q = 900  # quarter-hour grid so that edges meet often

create = st.tuples(
    st.just("create"), st.sampled_from(PEOPLE),
    st.one_of(st.lists(st.integers(0, 7), min_size=1, max_size=4), st.sampled_from([1, 2, 4, 8])),
    st.integers(0, 40), st.integers(1, 16),
)
# `target` picks among the bookings made so far; `a` and `b` shape the change.
change = st.tuples(st.sampled_from(["extend", "cancel", "release", "reassign", "after", "before"]),
                   st.sampled_from(PEOPLE), st.integers(0, 30), st.integers(0, 40), st.integers(1, 16))


def overlapping_pairs(conn: sqlite3.Connection) -> list:
    return conn.execute(
        "SELECT a.booking_id, b.booking_id FROM booking_cards a JOIN booking_cards b"
        " ON a.card_uuid = b.card_uuid AND a.booking_id < b.booking_id"
        " JOIN bookings x ON x.id = a.booking_id JOIN bookings y ON y.id = b.booking_id"
        " WHERE x.status = 'booked' AND y.status = 'booked'"
        " AND x.starts_at < y.ends_at AND y.starts_at < x.ends_at"
    ).fetchall()


def peak_cards(conn: sqlite3.Connection, start: int = 0, end: int = 2**62) -> dict[str, int]:
    """Per user, the most cards live bookings hold at one moment in [start, end) (meeting bookings do not add up)."""
    changes: dict[str, list[tuple[int, int]]] = {}
    for b in rows.live_between(conn, start, end):
        changes.setdefault(b.user, []).extend([(max(b.start, start), len(b.cards)), (min(b.end, end), -len(b.cards))])
    peaks = {}
    for user, deltas in changes.items():
        current = peak = 0
        for _, delta in sorted(deltas):
            current += delta
            peak = max(peak, current)
        peaks[user] = peak
    return peaks


def snapshot(conn):
    return (conn.execute("SELECT * FROM bookings ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM booking_cards ORDER BY booking_id, card_uuid").fetchall())


def new_cards(booking, a: int, b: int) -> list[int]:
    """Cards to move `booking` to, as many as it has: keep all but one (b even), or shift them all by `a`."""
    if b % 2 == 0 and len(booking.cards) > 1:
        spare = [c for c in range(8) if c not in booking.cards]
        return [*booking.cards[1:], spare[a % len(spare)]]
    return sorted({(c + a) % 8 for c in booking.cards})


def step(conn, who, verb, target, a, b, now):
    """Try one step; returns the shape it took, for the tally of accepted shapes."""
    def as_(person):
        return BookingService(conn, person, CONFIG, FLEET.cards, FLEET.topology, lambda: now)

    if verb == "create":
        start = now + a * Q
        cards, count = (target, None) if isinstance(target, list) else (None, target)
        made = as_(who).create(cards=cards, count=count, start=start, end=start + b * Q)
        return "create at the limit" if peak_cards(conn, made.start, made.end)[made.user] == LIMIT else "create"
    last = conn.execute("SELECT max(id) FROM bookings").fetchone()[0]
    booking_id = 1 + target % last if last else target + 1
    base = rows.get(conn, booking_id)
    if base is not None and a % 4:  # mostly someone who may change it, sometimes whoever came
        holder = next(p for p in PEOPLE if p.uid == base.uid)
        who = ROOT if verb == "reassign" else holder
    if verb == "extend":
        as_(who).extend(booking_id, (base.end if base else now) + (b - 4) * Q)
    elif verb == "reassign":
        cards = new_cards(base, a, b) if base else [a % 8]
        moved = as_(who).reassign(booking_id, cards=cards)
        if set(moved.cards) & set(base.cards) and moved.cards != base.cards:
            return "reassign keeping some cards"
    elif verb in ("after", "before"):  # a booking that meets an existing one on its cards
        cards = list(base.cards) if base else [a % 8]
        edge = (base.end if verb == "after" else base.start) if base else now
        start, end = (edge, edge + b * Q) if verb == "after" else (edge - b * Q, edge)
        as_(who).create(cards=cards, start=start, end=end)
        return "back-to-back"
    else:
        getattr(as_(who), verb)(booking_id)
    return verb


# One quarter-hour per step. alice books cards 0,1 then, from when they end, 2,3; across both, 4,5: exactly her
# limit, as the first two only meet. bob books 0,1 from when hers end; alice's 2,3 grow; root moves her 0,1 onto
# 1,7 (keeping 1); she releases 4,5; bob cancels his.
SCRIPT = [("create", ALICE, [0, 1], 0, 8), ("create", ALICE, [2, 3], 7, 8), ("create", ALICE, [4, 5], 0, 14),
          ("after", BOB, 0, 0, 4), ("extend", BOB, 1, 1, 5), ("reassign", ALICE, 0, 5, 2), ("release", BOB, 2, 1, 1),
          ("cancel", ALICE, 3, 1, 1)]
SCRIPT_SHAPES = ["create", "create", "create at the limit", "back-to-back", "extend", "reassign keeping some cards",
                 "release", "cancel"]


@pytest.mark.timeout(120)
def test_the_scripted_shapes_are_each_accepted(conn):
    """Rules that refused what they should allow would still keep the invariants: here every step must pass."""
    shapes = [step(conn, who, verb, target, a, b, FROZEN_NOW + n * Q)
              for n, (verb, who, target, a, b) in enumerate(SCRIPT)]
    assert shapes == SCRIPT_SHAPES
    assert overlapping_pairs(conn) == [] and peak_cards(conn) == {"alice": LIMIT}  # bob cancelled his


@pytest.mark.timeout(120)  # a hang guard: a rule that loops under the write lock must fail, not stall the suite
def test_accepted_bookings_never_overlap(tmp_path_factory):
    tally: Counter = Counter()

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(steps=st.lists(st.one_of(create, change), min_size=1, max_size=25), tick=st.integers(0, 4))
    @example(tick=1, steps=SCRIPT)  # every shape at least once, whatever the random draw
    def run(steps, tick):
        conn = connect(tmp_path_factory.mktemp("prop") / "board.db")
        for n, (verb, who, target, a, b) in enumerate(steps):
            now = FROZEN_NOW + tick * n * Q
            before = snapshot(conn)
            tally["tried"] += 1
            try:
                shape = step(conn, who, verb, target, a, b, now)
                tally["accepted"] += 1
                tally[shape] += 1
            except BoardError:
                assert snapshot(conn) == before  # a refusal changes no booking
            assert overlapping_pairs(conn) == []
            assert all(peak <= LIMIT for peak in peak_cards(conn).values()), peak_cards(conn)
        conn.close()

    run()
    assert tally["accepted"] >= 0.3 * tally["tried"], tally
    for shape in ("create", "create at the limit", "back-to-back", "reassign keeping some cards", "extend",
                  "cancel", "release"):
        assert tally[shape] > 0, (shape, tally)


def test_the_overlap_trigger_stops_a_writer_that_bypasses_the_app(make_service, conn):
    make_service().create(cards=[0], start=FROZEN_NOW, end=FROZEN_NOW + 3600)
    conn.execute('INSERT INTO bookings ("user", uid, starts_at, ends_at, created_at, created_by)'
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

"""The pieces under the queue: schema v5's migration, window openings as candidate starts, and the backfill's rules."""

from __future__ import annotations

import sqlite3
from datetime import datetime
from zoneinfo import ZoneInfo

from app.config import ClassWindow, Config, Policy, Pool
from app.core import policy
from app.store import bookings as rows
from app.store import schema
from app.store.db import connect
from tests.conftest import FROZEN_NOW

H = 3600
NOW = FROZEN_NOW


def test_a_v4_database_gains_the_queue_columns_and_its_bookings_waited_for_nothing(tmp_path):
    path = tmp_path / "board.db"
    raw = sqlite3.connect(path, isolation_level=None)
    for script in schema.MIGRATIONS[:4]:  # the database as board v4 left it
        for statement in schema._statements(script):
            raw.execute(statement)
    raw.execute("PRAGMA user_version = 4")
    raw.execute("INSERT INTO cards (uuid, idx, seen_at) VALUES ('GPU-0', 0, 0)")
    raw.execute("INSERT INTO bookings (id, user, uid, starts_at, ends_at, created_at, created_by)"
                " VALUES (1, 'alice', 1001, 7200, 10800, 5, 1001)")
    raw.execute("INSERT INTO booking_cards (card_uuid, booking_id) VALUES ('GPU-0', 1)")
    raw.close()
    conn = connect(path)
    try:
        booking = rows.get(conn, 1)
        assert (booking.requested_at, booking.queued, booking.series_id, booking.notice) == (7200, None, None, None)
        assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.LATEST >= 5
    finally:
        conn.close()


def test_window_openings_are_wall_clock_across_a_dst_change():
    night = ClassWindow(19 * 60, 7 * 60, weekends=False)
    config = Config(policy=Policy(timezone="Europe/Berlin"), pools=(Pool("prod", (0,), windows={"finetune": night}),))
    berlin = ZoneInfo("Europe/Berlin")
    start = int(datetime(2026, 10, 24, 12, 0, tzinfo=berlin).timestamp())  # clocks go back on the 25th
    opens = policy.window_opens(config, "finetune", start, start + 3 * 86400)
    assert [datetime.fromtimestamp(t, berlin).strftime("%a %H:%M") for t in opens] == ["Sat 19:00", "Sun 19:00", "Mon 19:00"]
    assert opens[1] - opens[0] == 25 * H  # the day the clocks went back is an hour longer
    assert policy.window_opens(config, "online", start, start + 3 * 86400) == []


def test_a_weekend_window_also_opens_at_saturday_midnight():
    day = ClassWindow(9 * 60, 19 * 60, weekends=True)
    config = Config(policy=Policy(timezone="UTC"), pools=(Pool("prod", (0,), windows={"batch": day}),))
    friday = int(datetime(2026, 12, 4, 20, 0, tzinfo=ZoneInfo("UTC")).timestamp())
    opens = policy.window_opens(config, "batch", friday, friday + 86400)
    assert [datetime.fromtimestamp(t, ZoneInfo("UTC")).strftime("%a %H:%M") for t in opens] == ["Sat 00:00", "Sat 09:00"]


class TestBackfill:
    def test_it_never_moves_a_booking_later_nor_one_that_did_not_ask(self, make_service, conn):
        alice = make_service()
        blocker = alice.create(cards=list(range(8)), start=NOW, end=NOW + 2 * H)
        queued = alice.create(count=1, start=NOW, end=NOW + H, or_later=True)
        fixed = make_service("bob", 1002).create(cards=[5], start=NOW + 2 * H, end=NOW + 3 * H)
        assert make_service("root", 0, admin=True).backfill() == []  # nothing freed: nothing moves
        alice.cancel(blocker.id)
        moved = make_service("root", 0, admin=True).backfill()
        assert [(before.id, after.start) for before, after in moved] == [(queued.id, NOW)]
        assert rows.get(conn, fixed.id).start == NOW + 2 * H
        assert make_service("root", 0, admin=True).backfill() == []  # at its wanted start: it stays

    def test_it_waits_for_when_the_holder_wanted_the_cards_from(self, make_service, conn):
        alice = make_service()
        blocker = alice.create(cards=list(range(8)), start=NOW, end=NOW + 4 * H)
        queued = alice.create(count=1, start=NOW + 2 * H, end=NOW + 3 * H, or_later=True)
        assert (queued.start, queued.requested_at) == (NOW + 4 * H, NOW + 2 * H)
        alice.cancel(blocker.id)
        make_service("root", 0, admin=True).backfill()
        assert rows.get(conn, queued.id).start == NOW + 2 * H  # not now: it was wanted from 17:30

    def test_the_holders_rules_apply_to_the_move(self, make_service, conn):
        limit = Config(policy=Policy(max_cards_per_user=2))
        alice = make_service(config=limit)
        blocker = make_service("bob", 1002).create(cards=list(range(8)), start=NOW, end=NOW + 2 * H)
        held = alice.create(cards=[7], start=NOW + 2 * H, end=NOW + 3 * H)
        queued = alice.create(count=2, start=NOW, end=NOW + H, or_later=True)
        assert queued.start == NOW + 3 * H  # with card 7 held 17:30-18:30, two more would be three at once
        make_service("bob", 1002).cancel(blocker.id)
        make_service("root", 0, admin=True, config=limit).backfill()
        assert rows.get(conn, queued.id).start == NOW  # now is free of card 7 and of bob: two cards are fine
        assert rows.get(conn, held.id).start == NOW + 2 * H

    def test_a_queued_count_moves_onto_other_cards_while_its_old_ones_are_taken_then(self, make_service, conn):
        alice, bob = make_service(), make_service("bob", 1002)
        bob.create(cards=[0, 1, 2, 3], start=NOW, end=NOW + 2 * H)
        lab = bob.create(cards=[4, 5, 6, 7], start=NOW, end=NOW + 3 * H)
        queued = alice.create(count=4, start=NOW + 120, end=NOW + H + 120, or_later=True)  # past the now grace
        assert (queued.cards, queued.start) == ((0, 1, 2, 3), NOW + 2 * H)
        bob.cancel(lab.id)
        moved = make_service("root", 0, admin=True).backfill()
        after = rows.get(conn, queued.id)
        assert (after.cards, after.start) == ((4, 5, 6, 7), NOW + 120)  # cards 0-3 are bob's then
        assert [a.id for _, a in moved] == [queued.id]

    def test_the_freed_time_goes_to_online_first_and_the_rest_follows_in_the_same_call(self, make_service, conn):
        alice = make_service()
        blocker = make_service("bob", 1002).create(cards=list(range(8)), start=NOW, end=NOW + 4 * H)
        first = alice.create(cards=[0], start=NOW + 60, end=NOW + 2 * H, or_later=True)
        second = make_service("carol", 1003).create(cards=[0], start=NOW + 60, end=NOW + H, or_later=True,
                                                     klass="online")
        assert (first.start, second.start) == (NOW + 4 * H, NOW + 6 * H - 60)
        make_service("bob", 1002).cancel(blocker.id)
        make_service("root", 0, admin=True).backfill()
        # online first: it takes the hour from 15:31; then experiment follows it, in the same call.
        assert rows.get(conn, second.id).start == NOW + 60
        assert rows.get(conn, first.id).start == NOW + H

    def test_an_admin_move_takes_a_booking_out_of_the_queue(self, make_service, conn):
        blocker = make_service("bob", 1002).create(cards=[3], start=NOW, end=NOW + 2 * H)
        queued = make_service().create(cards=[3], start=NOW + 60, end=NOW + H, or_later=True)
        make_service("root", 0, admin=True).move(queued.id, NOW + 5 * H, NOW + 6 * H)
        make_service("bob", 1002).cancel(blocker.id)
        assert make_service("root", 0, admin=True).backfill() == []
        after = rows.get(conn, queued.id)
        assert (after.start, after.queued) == (NOW + 5 * H, None)
        assert after.notice.startswith("moved from ") and after.notice.endswith(" by admin root")

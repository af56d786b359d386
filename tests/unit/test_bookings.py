"""Booking rules through BookingService on a real SQLite file."""

import re

import pytest

from app.config import Config, Policy
from app.errors import BadInput, Conflict, NotPermitted
from app.store import bookings as rows
from app.store import events
from app.core.text import format_time
from tests.conftest import FROZEN_NOW, sqlite_only, worded

H = 3600
NOW = FROZEN_NOW


@pytest.fixture
def fleet(fleet):
    """The default fleet, idle and cool: these rules are the calendar's; what runs on the cards now is
    test_booking_sees_cards.py's."""
    from msgspec.structs import replace

    return replace(fleet, cards=tuple(replace(c, processes=(), temperature_c=40) for c in fleet.cards))


def live(conn):
    return rows.listing(conn, start=None, end=None, user=None, include_cancelled=False)


class TestCreate:
    def test_explicit_cards(self, make_service, conn):
        booking = make_service().create(cards=[1, 0], start=NOW, end=NOW + H, note="sweep")
        assert booking.cards == (0, 1)
        assert (booking.user, booking.start, booking.end, booking.klass, booking.note) == (
            "alice", NOW, NOW + H, "experiment", "sweep")
        assert [b.id for b in live(conn)] == [booking.id]

    def test_count_picks_one_switch(self, make_service):
        service = make_service()
        service.create(cards=[0], start=NOW, end=NOW + H)
        assert service.create(count=4, start=NOW, end=NOW + H).cards == (4, 5, 6, 7)
        assert service.create(count=2, start=NOW, end=NOW + H).cards == (1, 2)

    def test_count_takes_the_earliest_later_slot_when_all_are_busy(self, make_service):
        service = make_service()
        service.create(count=8, start=NOW, end=NOW + 2 * H)
        with pytest.raises(Conflict) as refused:  # a count starts when asked, or not at all
            service.create(count=2, start=NOW, end=NOW + H)
        assert worded(refused.value) == ("no 2 cards are free for an experiment booking at 15:30 (now): cards 0,1,2,3,4,5,6,7"
                                      " are booked by alice until 17:30 (in 2 h) (booking 1); the earliest start that"
                                      " works: 17:30 (in 2 h) on cards 0,1 (--or-later takes it)")
        booking = service.create(count=2, start=NOW, end=NOW + H, or_later=True)
        assert (booking.start, booking.end, booking.queued, booking.requested_at) == (NOW + 2 * H, NOW + 3 * H, "cards", NOW)

    @pytest.mark.parametrize(
        "kwargs, error, message",
        [
            ({"cards": [0], "start": NOW - 120, "end": NOW + H}, BadInput, "in the past"),
            ({"cards": [0], "start": NOW + H, "end": NOW + H}, BadInput, "end must be after the start"),
            ({"cards": [0], "start": NOW, "end": NOW + 100 * H}, NotPermitted, "at most 72 h"),
            ({"cards": [9], "start": NOW, "end": NOW + H}, BadInput, "unknown card 9; the cards are 0-7"),
            ({"count": 3, "start": NOW, "end": NOW + H}, BadInput, "1, 2, 4 or 8 cards, not 3"),
            ({"cards": [0], "start": NOW, "end": NOW + H, "klass": "urgent"}, BadInput, "unknown class 'urgent'"),
            ({"cards": [0], "start": NOW, "end": NOW + H, "note": "x" * 501}, BadInput, "keep it to 500"),
        ],
    )
    def test_refusals_name_the_reason_and_write_nothing(self, make_service, conn, kwargs, error, message):
        with pytest.raises(error, match=message):
            make_service().create(**kwargs)
        assert live(conn) == []

    def test_a_start_within_the_last_minute_is_accepted(self, make_service):
        assert make_service().create(cards=[0], start=NOW - 30, end=NOW + H).start == NOW - 30

    def test_overlap_names_holder_end_and_next_free_start(self, make_service, conn):
        make_service("bob", 1002).create(cards=[2], start=NOW, end=NOW + 2 * H)
        with pytest.raises(Conflict) as refused:
            make_service().create(cards=[1, 2], start=NOW + H, end=NOW + 3 * H)
        message = worded(refused.value)
        assert "card 2 is booked by bob until 17:30 (in 2 h)" in message
        assert "next free start for cards 1,2: 17:30 (in 2 h)" in message
        assert len(live(conn)) == 1

    @pytest.mark.parametrize("starts, said", [
        (0, "until 17:30 (in 2 h)"),  # it started now: held until its end
        (-H, "until 17:30 (in 2 h)"),
        (1, "from 15:30 (now) to 17:30"),  # a second ahead: not held yet
        (60, "from 15:31 (in 1 min) to 17:30"),
        (H, "from 16:30 (in 60 min) to 17:30"),
    ])
    def test_a_clash_that_starts_later_says_from_when_to_when(self, make_service, fleet, starts, said):
        """Issue 31 §8: a clash with a future booking said 'booked by erin until 12:00' when it starts at 08:00."""
        bob = make_service("bob", 1002, now=NOW + min(starts, 0)).create(cards=[2], start=NOW + starts,
                                                                          end=NOW + 2 * H)
        for ask in (dict(cards=[2]), dict(count=len(fleet.cards))):  # named cards (SlotTaken) and a count (_no_group)
            with pytest.raises(Conflict) as refused:
                make_service().create(**ask, start=NOW, end=NOW + 3 * H)
            assert f"card 2 is booked by bob {said} (booking {bob.id})" in worded(refused.value)

    def test_a_multi_card_booking_is_all_or_nothing(self, make_service, conn):
        make_service("bob", 1002).create(cards=[3], start=NOW, end=NOW + H)
        with pytest.raises(Conflict):
            make_service().create(cards=[0, 1, 2, 3], start=NOW, end=NOW + H)
        assert conn.execute("SELECT count(*) FROM booking_cards").fetchone()[0] == 1

    def test_back_to_back_bookings_do_not_overlap(self, make_service):
        make_service().create(cards=[0], start=NOW, end=NOW + H)
        assert make_service("bob", 1002).create(cards=[0], start=NOW + H, end=NOW + 2 * H).start == NOW + H

    def test_lost_cards_are_refused_and_skipped(self, conn, make_service, fleet):
        from msgspec.structs import replace

        from app.service.rules.bookings import BookingService
        from app.core.identity import Identity

        cards = [replace(c, lost=True) if c.index == 0 else c for c in fleet.cards]
        service = BookingService(conn, Identity("alice", 1001, False), Config(), cards, fleet.topology, lambda: NOW)
        with pytest.raises(NotPermitted, match="card 0 is lost"):
            service.create(cards=[0], start=NOW, end=NOW + H)
        assert service.create(count=2, start=NOW, end=NOW + H).cards == (1, 2)

    def test_policy_limits_cards_per_user(self, make_service):
        service = make_service(config=Config(policy=Policy(max_cards_per_user=2)))
        service.create(cards=[0], start=NOW, end=NOW + H)
        with pytest.raises(NotPermitted, match="hold 3 cards at once; the limit is 2"):
            service.create(cards=[1, 2], start=NOW, end=NOW + H)


class TestChanges:
    def test_cancel_scheduled_marks_it_cancelled(self, make_service, conn):
        service = make_service()
        booking = service.create(cards=[0], start=NOW + H, end=NOW + 2 * H)
        assert service.cancel(booking.id).status == "cancelled"
        assert live(conn) == []

    def test_cancel_active_ends_it_now(self, make_service):
        service = make_service()
        booking = service.create(cards=[0], start=NOW, end=NOW + 2 * H)
        later = make_service(now=NOW + 600)
        cancelled = later.cancel(booking.id)
        assert (cancelled.status, cancelled.end) == ("booked", NOW + 600)

    def test_release_needs_a_started_booking(self, make_service):
        service = make_service()
        booking = service.create(cards=[0], start=NOW + H, end=NOW + 2 * H)
        with pytest.raises(BadInput, match="not started yet; cancel it instead"):
            service.release(booking.id)
        assert make_service(now=NOW + H + 60).release(booking.id).end == NOW + H + 60

    def test_extend_only_into_free_time(self, make_service):
        service = make_service()
        booking = service.create(cards=[0, 1], start=NOW, end=NOW + H)
        make_service("bob", 1002).create(cards=[1], start=NOW + 2 * H, end=NOW + 3 * H)
        assert service.extend(booking.id, NOW + 2 * H).end == NOW + 2 * H
        with pytest.raises(Conflict, match="card 1 is booked by bob"):
            service.extend(booking.id, NOW + 150 * 60)
        assert service.get(booking.id).end == NOW + 2 * H

    def test_past_bookings_cannot_change(self, make_service):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + H)
        later = make_service(now=NOW + 2 * H)
        for action in (later.cancel, later.release, lambda i: later.extend(i, NOW + 3 * H)):
            with pytest.raises(BadInput, match="already ended"):
                action(booking.id)

    @pytest.mark.parametrize("verb", ["cancel", "release", "extend"])
    def test_only_the_owner_or_an_admin(self, make_service, conn, verb):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + H)
        act = {"cancel": lambda s: s.cancel(booking.id), "release": lambda s: s.release(booking.id),
               "extend": lambda s: s.extend(booking.id, NOW + 2 * H)}[verb]
        with pytest.raises(NotPermitted, match=f"belongs to alice; only they or an admin can {verb} it"):
            act(make_service("bob", 1002))
        refused = events.recent(conn, 1)[0]
        assert (refused.actor, refused.action, refused.ok, refused.booking_id) == ("bob", verb, False, booking.id)
        act(make_service("carol", 1003, admin=True))
        done = events.recent(conn, 1)[0]
        assert (done.actor, done.action, done.ok) == ("carol", verb, True)

    def test_reassign_is_admin_only_and_keeps_the_count(self, make_service):
        booking = make_service().create(cards=[0, 1], start=NOW, end=NOW + H)
        with pytest.raises(NotPermitted, match="only admins"):
            make_service().reassign(booking.id, cards=[4, 5])
        admin = make_service("root", 0, admin=True)
        with pytest.raises(BadInput, match="has 2 card"):
            admin.reassign(booking.id, cards=[4])
        assert admin.reassign(booking.id, cards=[5, 4]).cards == (4, 5)
        assert admin.reassign(booking.id, user="root").user == "root"
        with pytest.raises(BadInput, match="no user"):
            admin.reassign(booking.id, user="nobody-by-that-name")

    def test_reassign_onto_a_busy_card_is_a_conflict(self, make_service):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + H)
        make_service("bob", 1002).create(cards=[4], start=NOW, end=NOW + H)
        with pytest.raises(Conflict, match="booked by bob"):
            make_service("root", 0, admin=True).reassign(booking.id, cards=[4])

    def test_unknown_booking(self, make_service):
        with pytest.raises(BadInput, match="no booking 42"):
            make_service().cancel(42)


def add_server(conn, booking, state="ready", port=8100):
    """A servers row on `booking`, as board serve leaves it."""
    with conn:
        return conn.execute(
            "INSERT INTO servers (booking_id, \"user\", uid, cards, card_uuids, model, host, port, cmdline, state, created_at)"
            " VALUES (?, ?, ?, '[]', '[]', '/m.gguf', '127.0.0.1', ?, '[]', ?, ?)",
            (booking.id, booking.user, booking.uid, port, state, NOW),
        ).lastrowid


class TestReassign:
    """An admin moves a booking to other cards or another user; the past stays as it was."""

    def admin(self, make_service, now=NOW + H):
        return make_service("root", 0, admin=True, now=now)

    def test_an_active_booking_splits_at_now_onto_cards_free_from_now_on(self, make_service, conn):
        # bob held card 4 for the first hour; alice's booking on card 0 has run for an hour and a half.
        make_service("bob", 1002).create(cards=[4], start=NOW, end=NOW + H)
        booking = make_service().create(cards=[0], start=NOW, end=NOW + 3 * H, klass="online", note="sweep",
                                        request={"model": "/m.gguf"})
        moved = self.admin(make_service, NOW + 90 * 60).reassign(booking.id, cards=[4])
        assert moved.id != booking.id
        assert (moved.cards, moved.start, moved.end) == ((4,), NOW + 90 * 60, NOW + 3 * H)
        assert (moved.user, moved.uid, moved.klass, moved.note, moved.request, moved.status) == (
            "alice", 1001, "online", "sweep", {"model": "/m.gguf"}, "booked")
        history = rows.get(conn, booking.id)
        assert (history.cards, history.start, history.end, history.status) == ((0,), NOW, NOW + 90 * 60, "booked")
        event = events.recent(conn, 1)[0]
        assert (event.action, event.ok, event.booking_id) == ("reassign", True, booking.id)
        assert event.details["from_booking"] == booking.id and event.details["to_booking"] == moved.id
        assert (event.details["old_cards"], event.details["cards"]) == ([0], [4])
        assert (event.details["old_user"], event.details["user"]) == ("alice", None)
        assert event.details["split_at"] == NOW + 90 * 60

    def test_a_move_onto_cards_shared_with_the_old_ones_splits_cleanly(self, make_service, conn):
        booking = make_service().create(cards=[0, 1], start=NOW, end=NOW + 2 * H)
        moved = self.admin(make_service).reassign(booking.id, cards=[1, 2])
        assert (moved.cards, moved.start) == ((1, 2), NOW + H)
        assert rows.get(conn, booking.id).cards == (0, 1)

    def test_a_future_booking_moves_whole_and_keeps_its_id(self, make_service, conn):
        booking = make_service().create(cards=[0, 1], start=NOW + 2 * H, end=NOW + 3 * H)
        moved = self.admin(make_service).reassign(booking.id, cards=[5, 4])
        assert (moved.id, moved.cards, moved.start, moved.end) == (booking.id, (4, 5), booking.start, booking.end)
        assert [b.id for b in live(conn)] == [booking.id]
        assert "to_booking" not in events.recent(conn, 1)[0].details

    def test_new_cards_and_a_new_user_at_once_leave_the_past_with_the_old_user(self, make_service, conn):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + 2 * H)
        moved = self.admin(make_service).reassign(booking.id, cards=[3], user="root")
        assert (moved.user, moved.uid, moved.cards) == ("root", 0, (3,))
        assert rows.get(conn, booking.id).user == "alice"
        details = events.recent(conn, 1)[0].details
        assert (details["old_user"], details["user"], details["old_cards"], details["cards"]) == ("alice", "root", [0], [3])

    def test_a_new_user_alone_keeps_the_booking(self, make_service):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + 2 * H)
        given = self.admin(make_service).reassign(booking.id, user="root")
        assert (given.id, given.user, given.start, given.cards) == (booking.id, "root", NOW, (0,))

    def test_the_same_cards_are_no_move(self, make_service):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + 2 * H)
        assert self.admin(make_service).reassign(booking.id, cards=[0]).id == booking.id

    @pytest.mark.parametrize("kwargs, message", [
        ({"cards": [4]}, "has 2 card"),
        ({"cards": [4, 9]}, "unknown card 9"),
        ({"user": "nobody-by-that-name"}, "no user"),
    ])
    def test_an_admins_bad_input_writes_nothing(self, make_service, conn, kwargs, message):
        booking = make_service().create(cards=[0, 1], start=NOW, end=NOW + 2 * H)
        before = events.recent(conn, 100)
        with pytest.raises(BadInput, match=message):
            self.admin(make_service).reassign(booking.id, **kwargs)
        assert events.recent(conn, 100) == before  # bad input: no audit row, as everywhere
        assert rows.get(conn, booking.id) == booking

    def test_an_admins_reassign_of_an_ended_or_missing_booking_writes_nothing(self, make_service, conn):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + H)
        before = events.recent(conn, 100)
        for target, message in ((booking.id, "already ended"), (42, "no booking 42")):
            with pytest.raises(BadInput, match=message):
                self.admin(make_service, NOW + 2 * H).reassign(target, cards=[4])
        assert events.recent(conn, 100) == before

    def test_live_servers_refuse_the_move_without_force(self, make_service, conn):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + 2 * H)
        server = add_server(conn, booking)
        with pytest.raises(Conflict) as refused:
            self.admin(make_service).reassign(booking.id, cards=[4])
        assert refused.value.exit_code == 3
        assert str(refused.value) == (f"booking {booking.id} has server {server} running on cards 0;"
                                      " stop it first, or pass --force to stop it and move the booking")
        assert rows.get(conn, booking.id) == booking and len(live(conn)) == 1
        event = events.recent(conn, 1)[0]
        assert (event.ok, event.details["old_cards"], event.details["cards"]) == (False, [0], [4])
        moved = self.admin(make_service).reassign(booking.id, cards=[4], force=True)
        assert moved.cards == (4,)
        assert events.recent(conn, 1)[0].details["stopped"] == [f"server {server}"]

    def test_only_live_servers_count(self, make_service, conn):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + 2 * H)
        for n, state in enumerate(("stopped", "crashed", "failed")):
            add_server(conn, booking, state, port=8100 + n)
        assert self.admin(make_service).reassign(booking.id, cards=[4]).cards == (4,)

    @pytest.mark.parametrize("state", ["starting", "ready", "stopping"])
    def test_every_live_state_counts(self, make_service, conn, state):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + 2 * H)
        add_server(conn, booking, state)
        with pytest.raises(Conflict, match="pass --force"):
            self.admin(make_service).reassign(booking.id, cards=[4])

    def test_a_new_user_alone_waits_for_live_servers_unless_forced_and_then_splits_at_now(self, make_service, conn):
        """The old holder's server must not go on serving on the new holder's booking (issue 31 §8): as with
        --cards, exit 3 saying what to do; forced, the old holder's piece ends now (the enforcer stops the server)."""
        booking = make_service().create(cards=[0], start=NOW, end=NOW + 2 * H)
        server = add_server(conn, booking)
        with pytest.raises(Conflict) as refused:
            self.admin(make_service).reassign(booking.id, user="root")
        assert refused.value.exit_code == 3
        assert str(refused.value) == (f"booking {booking.id} has server {server} running on cards 0;"
                                      " stop it first, or pass --force to stop it and give the booking to root")
        assert rows.get(conn, booking.id) == booking
        given = self.admin(make_service).reassign(booking.id, user="root", force=True)
        assert (given.user, given.start, given.end, given.cards) == ("root", NOW + H, NOW + 2 * H, (0,))
        assert given.id != booking.id
        old = rows.get(conn, booking.id)
        assert (old.user, old.start, old.end) == ("alice", NOW, NOW + H)  # ended: the server's booking is over
        details = events.recent(conn, 1)[0].details
        assert (details["stopped"], details["to_booking"]) == ([f"server {server}"], given.id)

    def test_a_new_user_with_no_running_work_keeps_the_booking_and_a_stopped_server_does_not_count(self, make_service,
                                                                                                    conn):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + 2 * H)
        add_server(conn, booking, "stopped")
        given = self.admin(make_service).reassign(booking.id, user="root")
        assert (given.id, given.user, given.start) == (booking.id, "root", NOW)


class TestAudit:
    def test_every_change_and_refusal_is_recorded_and_chained(self, make_service, conn):
        service = make_service()
        booking = service.create(cards=[0], start=NOW, end=NOW + H)
        with pytest.raises(Conflict):
            make_service("bob", 1002).create(cards=[0], start=NOW, end=NOW + H)
        service.extend(booking.id, NOW + 2 * H)
        service.cancel(booking.id)
        log = [(e.actor, e.action, e.ok) for e in reversed(events.recent(conn))]
        assert log == [("alice", "create", True), ("bob", "create", False), ("alice", "extend", True), ("alice", "cancel", True)]
        assert events.first_broken(conn) is None

    def test_bad_input_writes_no_event(self, make_service, conn):
        with pytest.raises(BadInput):
            make_service().create(cards=[0], start=NOW - 3600, end=NOW)
        assert events.recent(conn) == []


class TestPlan:
    def test_plan_writes_nothing_and_words_a_conflict_like_create(self, make_service, conn):
        make_service("bob", 1002).create(cards=[2], start=NOW, end=NOW + 2 * H)
        before = conn.execute("SELECT count(*) FROM events").fetchone()[0]
        with pytest.raises(Conflict) as refused:
            make_service().plan(cards=[2], start=NOW, end=NOW + H)
        assert re.search(r"card 2 is booked by bob until 17:30 .*next free start for cards 2: 17:30 \(in 2 h",
                         worded(refused.value))
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == before

    def test_next_free_reads_past_the_lookahead_when_the_next_day_is_full(self, make_service):
        from app.service.rules.bookings import LOOKAHEAD_SECONDS

        bob = make_service("bob", 1002, config=Config(policy=Policy(max_booking_hours=1000)))
        bob.create(cards=[0], start=NOW, end=NOW + LOOKAHEAD_SECONDS + 5 * H)
        assert make_service().next_free([0], NOW, H) == NOW + LOOKAHEAD_SECONDS + 5 * H


class TestBoundaries:
    """Each rule exactly at its limit (allowed) and one unit past it (refused)."""

    def test_the_longest_booking_exactly(self, make_service, conn):
        """72 h is accepted and 72 h 1 s refused, and nothing written for it. Fails on: `>=` for `>` (72 h refused);
        the limit a second later (`> limit + 1`); the check dropped; a default of 73 h for 72."""
        service = make_service()  # the default policy: 72 h
        assert service.create(cards=[0], start=NOW, end=NOW + 72 * H).end == NOW + 72 * H
        with pytest.raises(NotPermitted, match="at most 72 h"):
            service.create(cards=[1], start=NOW, end=NOW + 72 * H + 1)
        assert len(live(conn)) == 1

    def test_an_extension_to_the_longest_booking_exactly(self, make_service):
        service = make_service()
        booking = service.create(cards=[0], start=NOW, end=NOW + H)
        with pytest.raises(NotPermitted, match="at most 72 h"):
            service.extend(booking.id, NOW + 72 * H + 1)
        assert service.extend(booking.id, NOW + 72 * H).end == NOW + 72 * H

    def test_the_furthest_start_exactly(self, make_service):
        service = make_service()  # the default policy: 30 days ahead
        assert service.create(cards=[0], start=NOW + 30 * 86400, end=NOW + 30 * 86400 + H).start == NOW + 30 * 86400
        with pytest.raises(NotPermitted, match="at most 30 days ahead"):
            service.create(cards=[1], start=NOW + 30 * 86400 + 1, end=NOW + 30 * 86400 + H)

    def test_the_past_grace_exactly(self, make_service):
        from app.service.rules.bookings import PAST_GRACE_SECONDS

        service = make_service()
        assert service.create(cards=[0], start=NOW - PAST_GRACE_SECONDS, end=NOW + H).start == NOW - PAST_GRACE_SECONDS
        with pytest.raises(BadInput, match="in the past"):
            service.create(cards=[1], start=NOW - PAST_GRACE_SECONDS - 1, end=NOW + H)

    def test_the_shortest_booking_is_one_second(self, make_service):
        assert make_service().create(cards=[0], start=NOW, end=NOW + 1).end == NOW + 1

    def test_the_longest_note_exactly(self, make_service):
        from app.service.rules.bookings import MAX_NOTE_CHARS

        service = make_service()
        assert service.create(cards=[0], start=NOW, end=NOW + H, note="n" * MAX_NOTE_CHARS).note == "n" * MAX_NOTE_CHARS
        with pytest.raises(BadInput, match=f"keep it to {MAX_NOTE_CHARS}"):
            service.create(cards=[1], start=NOW, end=NOW + H, note="n" * (MAX_NOTE_CHARS + 1))

    def test_any_unicode_note_is_kept_but_a_lone_surrogate_is_bad_input(self, make_service, conn):
        service = make_service()
        assert service.create(cards=[0], start=NOW, end=NOW + H, note="é 😀 日本").note == "é 😀 日本"
        with pytest.raises(BadInput, match="not valid UTF-8"):
            service.create(cards=[1], start=NOW, end=NOW + H, note="bad \udcff")
        assert len(live(conn)) == 1

    def test_the_last_card_exists_and_the_next_does_not(self, make_service):
        service = make_service()
        assert service.create(cards=[7], start=NOW, end=NOW + H).cards == (7,)
        with pytest.raises(BadInput, match="unknown card 8; the cards are 0-7"):
            service.create(cards=[8], start=NOW, end=NOW + H)
        with pytest.raises(BadInput, match="unknown card -1"):
            service.create(cards=[-1], start=NOW, end=NOW + H)

    @pytest.mark.parametrize("count", [1, 2, 4, 8])
    def test_every_group_size_is_accepted(self, make_service, count):
        assert len(make_service().create(count=count, start=NOW, end=NOW + H).cards) == count

    def test_the_card_limit_exactly(self, make_service, conn):
        service = make_service(config=Config(policy=Policy(max_cards_per_user=2)))
        service.create(cards=[0], start=NOW, end=NOW + H)
        assert service.create(cards=[1], start=NOW, end=NOW + H).cards == (1,)  # 2 at once: the limit
        with pytest.raises(NotPermitted, match="hold 3 cards at once; the limit is 2"):
            service.create(cards=[2], start=NOW + H - 1, end=NOW + 2 * H)  # one second inside the first two
        assert len(live(conn)) == 2

    def test_back_to_back_bookings_are_not_held_at_once(self, make_service):
        service = make_service(config=Config(policy=Policy(max_cards_per_user=2)))
        service.create(cards=[0, 1], start=NOW, end=NOW + H)
        assert service.create(cards=[2, 3], start=NOW + H, end=NOW + 2 * H).cards == (2, 3)  # after
        assert service.create(cards=[4, 5], start=NOW + 2 * H, end=NOW + 3 * H).cards == (4, 5)
        assert service.create(cards=[0, 1], start=NOW + 3 * H, end=NOW + 4 * H).cards == (0, 1)  # same cards again
        later = make_service(config=Config(policy=Policy(max_cards_per_user=2)), now=NOW - H)
        assert later.create(cards=[6, 7], start=NOW - H, end=NOW).cards == (6, 7)  # before

    def test_a_booking_that_ends_now_no_longer_changes(self, make_service):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + H)
        assert make_service(now=NOW + H - 1).extend(booking.id, NOW + 2 * H).end == NOW + 2 * H
        with pytest.raises(BadInput, match="already ended"):
            make_service(now=NOW + 2 * H).extend(booking.id, NOW + 3 * H)

    def test_release_at_the_start_exactly(self, make_service, conn):
        booking = make_service().create(cards=[0], start=NOW + H, end=NOW + 2 * H)
        with pytest.raises(BadInput, match="not started yet"):
            make_service(now=NOW + H - 1).release(booking.id)
        make_service(now=NOW + H).release(booking.id)  # it has started: nothing of it has run, so it is cancelled
        assert live(conn) == []

    def test_an_extension_by_one_second(self, make_service):
        service = make_service()
        booking = service.create(cards=[0], start=NOW, end=NOW + H)
        with pytest.raises(BadInput, match="must be after the current end"):
            service.extend(booking.id, NOW + H)
        assert service.extend(booking.id, NOW + H + 1).end == NOW + H + 1

    def test_a_cancelled_booking_no_longer_changes(self, make_service):
        service = make_service()
        booking = service.create(cards=[0], start=NOW + H, end=NOW + 2 * H)
        service.cancel(booking.id)
        for action in (service.cancel, service.release, lambda i: service.extend(i, NOW + 3 * H)):
            with pytest.raises(BadInput, match="is cancelled"):
                action(booking.id)


class TestWrongRefusals:
    """The rules must allow what they should: a refusal here is a bug, not caution."""

    def test_an_extension_at_the_card_limit_does_not_count_the_booking_against_itself(self, make_service):
        service = make_service(config=Config(policy=Policy(max_cards_per_user=2)))
        booking = service.create(cards=[0, 1], start=NOW, end=NOW + H)  # exactly the limit
        assert service.extend(booking.id, NOW + 2 * H).end == NOW + 2 * H

    def test_an_extension_up_to_the_users_next_booking_is_not_held_at_once(self, make_service):
        service = make_service(config=Config(policy=Policy(max_cards_per_user=2)))
        booking = service.create(cards=[0], start=NOW, end=NOW + H)
        service.create(cards=[1, 2], start=NOW + 2 * H, end=NOW + 3 * H)
        assert service.extend(booking.id, NOW + 2 * H).end == NOW + 2 * H  # meets the 2-card booking
        with pytest.raises(NotPermitted, match="hold 3 cards at once; the limit is 2"):
            service.extend(booking.id, NOW + 2 * H + 1)
        assert service.get(booking.id).end == NOW + 2 * H

    def test_an_admins_extension_counts_the_holders_cards_not_the_admins(self, make_service):
        limit = Config(policy=Policy(max_cards_per_user=2))
        alice = make_service(config=limit)
        booking = alice.create(cards=[0], start=NOW, end=NOW + H)
        alice.create(cards=[1], start=NOW + H, end=NOW + 2 * H)
        alice.create(cards=[2, 3], start=NOW + 2 * H, end=NOW + 3 * H)
        admin = make_service("root", 0, admin=True, config=limit)
        admin.create(cards=[4, 5], start=NOW, end=NOW + 3 * H)  # the admin's own cards are not alice's
        assert admin.extend(booking.id, NOW + 2 * H).end == NOW + 2 * H  # alice holds 2 at once: the limit
        with pytest.raises(NotPermitted, match="hold 3 cards at once"):
            admin.extend(booking.id, NOW + 2 * H + 1)

    def test_a_future_booking_moves_onto_cards_that_overlap_its_own(self, make_service, conn):
        booking = make_service().create(cards=[0, 1], start=NOW + H, end=NOW + 2 * H)
        moved = make_service("root", 0, admin=True).reassign(booking.id, cards=[1, 2])
        assert (moved.id, moved.cards, moved.start, moved.end) == (booking.id, (1, 2), NOW + H, NOW + 2 * H)
        assert [b.id for b in live(conn)] == [booking.id]

    def test_a_move_onto_cards_free_from_the_end_of_another_booking(self, make_service):
        booking = make_service().create(cards=[0], start=NOW + H, end=NOW + 2 * H)
        make_service("bob", 1002).create(cards=[4], start=NOW, end=NOW + H)  # ends as alice's starts
        make_service("bob", 1002).create(cards=[4], start=NOW + 2 * H, end=NOW + 3 * H)  # starts as it ends
        assert make_service("root", 0, admin=True).reassign(booking.id, cards=[4]).cards == (4,)

    def test_a_reassign_to_more_or_fewer_cards_is_bad_input(self, make_service, conn):
        booking = make_service().create(cards=[0, 1], start=NOW + H, end=NOW + 2 * H)
        admin = make_service("root", 0, admin=True)
        for cards in ([4, 5, 6], [4], [4, 4]):  # a repeated card is one card
            with pytest.raises(BadInput, match=f"booking {booking.id} has 2 card\\(s\\); give as many") as refused:
                admin.reassign(booking.id, cards=cards)
            assert refused.value.exit_code == 2
        assert rows.get(conn, booking.id) == booking
        assert admin.reassign(booking.id, cards=[6, 4]).cards == (4, 6)


@pytest.mark.timeout(120)  # the window check loops under the write lock: a broken step must fail, not hang
class TestPools:
    """Pool rules through the service: refused where the pool says so, allowed where it does not."""

    def config(self):
        from app.config import ClassWindow, Pool

        night = ClassWindow(19 * 60, 9 * 60, weekends=False)
        prod = Pool("prod", (0, 1, 2, 3), ("online", "finetune"), windows={"finetune": night})
        return Config(policy=Policy(timezone="UTC"), pools=(prod, Pool("lab", (4, 5, 6, 7), max_hours=12)))

    def test_a_count_picks_only_cards_whose_pool_takes_the_class(self, make_service):
        service = make_service(config=self.config())
        assert service.create(count=4, start=NOW, end=NOW + H, klass="experiment").cards == (4, 5, 6, 7)
        assert service.create(count=4, start=NOW, end=NOW + H, klass="online").cards == (0, 1, 2, 3)
        later = service.create(count=2, start=NOW, end=NOW + H, klass="experiment", or_later=True)  # prod is free, not for it
        assert (later.cards, later.start) == ((4, 5), NOW + H)

    def test_a_window_refuses_outside_it_and_allows_inside_it(self, make_service, conn):
        service = make_service(config=self.config())  # NOW is Sunday 15:30 UTC, and the window has no weekends
        with pytest.raises(NotPermitted) as refused:
            service.create(cards=[0], start=NOW, end=NOW + H, klass="finetune")
        assert worded(refused.value) == ("card 0: class finetune is allowed on pool prod only 19:00-09:00 (UTC);"
                                         " next free start for cards 0: 19:00 (in 4 h)")
        night = NOW + 3 * H + 30 * 60  # Sunday 19:00
        assert service.create(cards=[0], start=night, end=night + 14 * H, klass="finetune").end == night + 14 * H
        with pytest.raises(NotPermitted, match="only 19:00-09:00"):
            service.create(cards=[1], start=night, end=night + 14 * H + 60, klass="finetune")
        assert len(live(conn)) == 1

    def test_the_pool_cap_exactly(self, make_service):
        service = make_service(config=self.config())
        assert service.create(cards=[4], start=NOW, end=NOW + 12 * H).end == NOW + 12 * H
        with pytest.raises(NotPermitted, match="card 5: pool lab allows at most 12 h"):
            service.create(cards=[5], start=NOW, end=NOW + 12 * H + 1)


class TestWording:
    """What a refusal says and what the audit log keeps: people (and `board log`) read both."""

    def test_bad_input_is_worded_exactly(self, make_service):
        service = make_service()
        cases = [
            ({"cards": [0], "start": NOW - 120, "end": NOW + H}, "the start 15:28 is in the past; pick a start from now on"),
            ({"cards": [0], "start": NOW + H, "end": NOW + H}, "the end must be after the start"),
            ({"cards": [], "start": NOW, "end": NOW + H}, "name at least one card"),
            ({"cards": [0], "start": NOW, "end": NOW + H, "klass": "urgent"},
             "unknown class 'urgent'; use one of online, batch, finetune, experiment"),
            ({"cards": [0], "start": NOW, "end": NOW + H, "note": "bad \udcff"},
             "the note is not valid UTF-8 text; retype it"),
        ]
        for kwargs, message in cases:
            with pytest.raises(BadInput) as refused:
                service.create(**kwargs)
            assert worded(refused.value) == message

    def test_a_server_with_no_cards_names_none(self, conn, fleet):
        from app.core.identity import Identity
        from app.service.rules.bookings import BookingService

        service = BookingService(conn, Identity("alice", 1001, False), Config(), [], fleet.topology, lambda: NOW)
        with pytest.raises(BadInput) as refused:
            service.create(cards=[0], start=NOW, end=NOW + H)
        assert str(refused.value) == "unknown card 0; the cards are none"

    def test_a_clash_on_several_cards_names_them_all(self, make_service):
        bob = make_service("bob", 1002).create(cards=[1, 2], start=NOW, end=NOW + 2 * H)
        with pytest.raises(Conflict) as refused:
            make_service().create(cards=[0, 1, 2], start=NOW, end=NOW + H)
        assert worded(refused.value) == (f"cards 1,2 are booked by bob until 17:30 (in 2 h) (booking {bob.id});"
                                      " next free start for cards 0,1,2: 17:30 (in 2 h)")

    def test_the_next_free_start_is_for_the_wanted_length_not_longer(self, make_service):
        bob = make_service("bob", 1002)
        first = bob.create(cards=[2], start=NOW, end=NOW + 2 * H)
        bob.create(cards=[2], start=NOW + 4 * H, end=NOW + 5 * H)  # the two-hour gap between fits one hour
        with pytest.raises(Conflict) as refused:
            make_service().create(cards=[2], start=NOW + H, end=NOW + 2 * H)
        assert worded(refused.value) == (f"card 2 is booked by bob until 17:30 (in 2 h) (booking {first.id});"
                                      " next free start for cards 2: 17:30 (in 2 h)")

    def test_no_cards_for_the_class_is_worded(self, make_service):
        from app.config import Pool

        config = Config(pools=(Pool("prod", tuple(range(8)), ("online",)),))
        with pytest.raises(NotPermitted) as refused:
            make_service(config=config).create(count=2, start=NOW, end=NOW + H, klass="batch")
        assert worded(refused.value) == ("2 cards for a 1h batch booking from 15:30 (now): the rules allow none: class batch"
                                      " is not allowed on pool prod (cards 0,1,2,3,4,5,6,7); no start within 30 days works"
                                      " either")

    def test_a_refusal_is_audited_with_its_reason(self, make_service, conn):
        service = make_service(config=Config(policy=Policy(max_cards_per_user=1)))
        with pytest.raises(NotPermitted) as refused:
            service.create(cards=[0, 1], start=NOW, end=NOW + H, note="sweep")
        event = events.recent(conn, 1)[0]
        assert (event.actor, event.action, event.ok, event.booking_id) == ("alice", "create", False, None)
        assert event.details == {"cards": [0, 1], "count": None, "start": NOW, "end": NOW + H, "class": "experiment",
                                 "note": "sweep", "refused": "you would hold 2 cards at once; the limit is 1",
                                 "refused_by": "policy"}
        assert str(refused.value) == "you would hold 2 cards at once; the limit is 1; no start within 30 days works either"

    def test_a_writer_that_beats_the_check_is_a_conflict(self, make_service, conn, monkeypatch):
        from app.service.rules import bookings

        make_service("bob", 1002).create(cards=[0], start=NOW, end=NOW + H)
        # Another writer got in between the check and the insert: the store's overlap trigger refuses.
        monkeypatch.setattr(bookings.rows, "first_conflict", lambda *args, **kwargs: None)
        with pytest.raises(Conflict) as refused:
            make_service().create(cards=[0], start=NOW, end=NOW + H)
        assert str(refused.value).startswith("the cards were just booked by someone else; try again (")
        assert len(live(conn)) == 1


class TestSearchEdges:
    """Slot searches read the next day first, the rest only when needed; answers must not depend on that."""

    def far_calendar(self, make_service):
        # Every card busy for 40 h, free for 20 h, busy again for 40 h: the second block starts past the lookahead.
        bob = make_service("bob", 1002)
        bob.create(count=8, start=NOW, end=NOW + 40 * H)
        bob.create(count=8, start=NOW + 60 * H, end=NOW + 100 * H)

    def test_a_count_does_not_take_a_gap_too_short_for_it(self, make_service):
        self.far_calendar(make_service)
        plan = make_service().plan(count=8, start=NOW, end=NOW + 30 * H, or_later=True)
        assert (plan.start, plan.end) == (NOW + 100 * H, NOW + 130 * H)

    def test_next_free_does_not_take_a_gap_too_short_for_it(self, make_service):
        self.far_calendar(make_service)
        assert make_service().next_free([3], NOW, 30 * H) == NOW + 100 * H
        assert make_service().next_free([3], NOW, 20 * H) == NOW + 40 * H

    def test_a_move_onto_an_own_card_suggests_a_time_that_ignores_the_booking_moved(self, make_service):
        booking = make_service().create(cards=[0, 1], start=NOW + H, end=NOW + 2 * H)
        bob = make_service("bob", 1002).create(cards=[2], start=NOW + H, end=NOW + 90 * 60)
        with pytest.raises(Conflict) as refused:
            make_service("root", 0, admin=True).reassign(booking.id, cards=[1, 2])
        # From 17:00 cards 1 and 2 are free for the hour: card 1 is only busy with the booking being moved.
        assert worded(refused.value) == (f"card 2 is booked by bob from 16:30 (in 60 min) to 17:00 (booking {bob.id});"
                                      " next free start for cards 1,2: 17:00 (in 2 h)")

    def test_a_move_past_the_lookahead_also_ignores_the_booking_moved(self, make_service):
        config = Config(policy=Policy(max_booking_hours=100))
        booking = make_service(config=config).create(cards=[0, 1], start=NOW + H, end=NOW + 61 * H)
        make_service("bob", 1002, config=config).create(cards=[2], start=NOW + H, end=NOW + 41 * H)
        with pytest.raises(Conflict) as refused:
            make_service("root", 0, admin=True, config=config).reassign(booking.id, cards=[1, 2])
        assert worded(refused.value).endswith(f"next free start for cards 1,2: {format_time(NOW + 41 * H, NOW)} (in 2 days)")


class TestOwnership:
    def test_other_users_cards_do_not_count_against_my_limit(self, make_service):
        limit = Config(policy=Policy(max_cards_per_user=2))
        make_service("bob", 1002, config=limit).create(cards=[0, 1], start=NOW, end=NOW + H)
        assert make_service(config=limit).create(cards=[2, 3], start=NOW, end=NOW + H).cards == (2, 3)
        assert make_service(config=limit).create(count=2, start=NOW + H, end=NOW + 2 * H).cards == (0, 1)

    def test_running_jobs_refuse_a_move(self, conn, fleet):
        from app.core.identity import Identity
        from app.service.rules.bookings import BookingService

        def service(name, uid, admin=False):
            return BookingService(conn, Identity(name, uid, admin), Config(), fleet.cards, fleet.topology,
                                  lambda: NOW, jobs=lambda booking_id: [4711] if booking_id == booking.id else [])

        booking = service("alice", 1001).create(cards=[0], start=NOW, end=NOW + 2 * H)
        with pytest.raises(Conflict, match=f"booking {booking.id} has job 4711 running on cards 0; stop it first"):
            service("root", 0, admin=True).reassign(booking.id, cards=[4])

    def test_a_booking_that_ends_exactly_now_no_longer_changes(self, make_service):
        booking = make_service().create(cards=[0], start=NOW, end=NOW + H)
        with pytest.raises(BadInput) as refused:
            make_service(now=NOW + H).extend(booking.id, NOW + 2 * H)
        assert str(refused.value) == f"booking {booking.id} has already ended; past bookings cannot change"

    def test_a_cancelled_booking_is_worded(self, make_service):
        service = make_service()
        booking = service.create(cards=[0], start=NOW + H, end=NOW + 2 * H)
        service.cancel(booking.id)
        with pytest.raises(BadInput) as refused:
            service.cancel(booking.id)
        assert str(refused.value) == f"booking {booking.id} is cancelled"


def test_a_refusal_and_its_earliest_start_come_from_the_calendar_in_memory(tmp_path, fleet):
    """The service keeps the live bookings in memory (app.store.bookings.Calendar): a refused booking, and the
    search for the earliest start that works which its message words, read no calendar from SQL."""
    from app.core.identity import Identity
    from app.gpu.fleet import Fleet
    from app.service import Service

    service = Service(Config(db_path=tmp_path / "board.db"), Fleet(_Source(fleet), 2.0), clock=lambda: NOW)
    alice, bob = Identity("alice", 1001, False), Identity("bob", 1002, False)
    for hour in range(0, 40, 2):
        service.call(alice, "book", {"count": 8, "start": NOW + hour * H, "end": NOW + (hour + 1) * H})
    statements: list[str] = []
    service.conn.set_trace_callback(statements.append)
    with pytest.raises(Conflict) as refused:
        service.call(bob, "book", {"cards": [3], "start": NOW, "end": NOW + 2 * H})
    service.conn.set_trace_callback(None)
    assert "next free start for cards 3" in str(refused.value)
    # No search reads the calendar from SQL; nor is the last booking made read again: its answer was read through the
    # calendar, which has it since.
    assert [s for s in statements if "FROM bookings" in s] == []
    service.close()


def test_the_calendar_reads_again_only_what_the_last_transaction_changed(tmp_path, fleet):
    """Bookings on named cards read the calendar only inside their write. Each transaction's changes are read again
    when it ends (app.store.db.write tells the calendar), not carried into every later one: a refusal after many
    bookings reads none of them again (before, it read them all)."""
    from app.core.identity import Identity
    from app.gpu.fleet import Fleet
    from app.service import Service

    service = Service(Config(db_path=tmp_path / "board.db"), Fleet(_Source(fleet), 2.0), clock=lambda: NOW)
    alice, bob = Identity("alice", 1001, False), Identity("bob", 1002, False)
    for hour in range(30):
        service.call(alice, "book", {"cards": [hour % 8], "start": NOW + hour * H, "end": NOW + (hour + 1) * H})
    statements: list[str] = []
    service.conn.set_trace_callback(statements.append)
    with pytest.raises(Conflict):
        service.call(bob, "book", {"cards": [29 % 8], "start": NOW + 29 * H, "end": NOW + 30 * H})
    service.conn.set_trace_callback(None)
    assert [s for s in statements if "FROM bookings" in s] == []  # the last booking too was read when it was made
    service.close()


class _Source:
    """The fleet as read once: a GpuSource that always says the same."""

    simulated = False

    def __init__(self, snapshot):
        self.snapshot = snapshot

    def read(self):
        return self.snapshot

    def close(self) -> None:
        pass


# Where `make mutation` found a nearly right rule untold apart: whose limit a search counts, and where it stops.

class TestEarliestUnderAnotherUsersLimit:
    """An admin's search for a holder (op earliest with `user`) counts the holder's cards, not the admin's."""

    def test_the_holders_cards_push_the_start_past_their_booking(self, make_service):
        one_card = Config(policy=Policy(max_cards_per_user=1))
        make_service(config=one_card).create(cards=[0], start=NOW, end=NOW + H)
        admin = make_service("root", 0, admin=True, config=one_card)
        search = {"cards": [3], "start": NOW, "duration": H}  # no class: an experiment
        # alice holds card 0 until 16:30: a second card for her fits only from then; root holds nothing.
        assert worded(admin.earliest_words({**search, "user": "alice"})) == "next free start for cards 3: 16:30 (in 60 min)"
        assert worded(admin.earliest_words(search)) == "next free start for cards 3: 15:30 (now)"


class TestBackfillOnTwoHosts:
    """Each host's service moves only its own host's queue (the fleet: one database, a service per host)."""

    def test_a_queued_booking_on_another_host_is_left_to_it_and_the_rest_still_move(self, conn, fleet):
        from msgspec.structs import replace

        from app.core.identity import Identity
        from app.service.rules.bookings import BookingService

        other = replace(fleet, cards=tuple(replace(c, uuid=f"B-{c.uuid}") for c in fleet.cards))

        def on(host, source, name, uid):
            return BookingService(conn, Identity(name, uid, False), Config(), source.cards, source.topology,
                                  lambda: NOW, host=host)

        # Host b: alice's online booking, first in the queue, waits behind bob's.
        bob = on("b", other, "bob", 1002).create(count=8, start=NOW, end=NOW + 2 * H)
        theirs = on("b", other, "alice", 1001).create(count=2, start=NOW, end=NOW + H, klass="online", or_later=True)
        # Host a: dave's experiment waits behind carol's on cards 0,1; once carol cancels, erin holds 0,1.
        carol = on("a", fleet, "carol", 1003).create(count=8, start=NOW, end=NOW + 2 * H)
        mine = on("a", fleet, "dave", 1004).create(count=2, start=NOW, end=NOW + H, or_later=True)
        assert (theirs.start, theirs.queued, mine.start, mine.cards) == (NOW + 2 * H, "cards", NOW + 2 * H, (0, 1))
        on("b", other, "bob", 1002).cancel(bob.id)
        on("a", fleet, "carol", 1003).cancel(carol.id)
        on("a", fleet, "erin", 1005).create(cards=[0, 1], start=NOW, end=NOW + H)

        moved = on("a", fleet, "root", 0).backfill()
        assert [(before.id, after.start, after.cards, after.host) for before, after in moved] == [
            (mine.id, NOW, (2, 3), "a")]
        assert rows.get(conn, theirs.id).start == NOW + 2 * H  # host b's service moves it, not a's
        hosts = dict(conn.execute("SELECT uuid, host FROM cards"))
        assert {hosts[c.uuid] for c in fleet.cards} == {"a"} and {hosts[c.uuid] for c in other.cards} == {"b"}


class TestExtendEdges:
    def test_an_end_at_or_before_the_current_end_is_bad_input_and_writes_nothing(self, make_service, conn):
        from app.errors import BadInput
        from app.store import events

        service = make_service()
        booking = service.create(cards=[0], start=NOW, end=NOW + 2 * H)
        before = events.recent(conn, 100)
        for end in (NOW + 2 * H, NOW + H):
            with pytest.raises(BadInput) as refused:
                service.extend(booking.id, end)
            assert worded(refused.value) == "the new end must be after the current end 17:30 (in 2 h)"
        assert events.recent(conn, 100) == before and service.get(booking.id).end == NOW + 2 * H
        assert service.extend(booking.id, NOW + 2 * H + 1).end == NOW + 2 * H + 1


class TestEarliestWordsInput:
    """op earliest hands a client's search to earliest_words: a search for neither cards nor a group is bad input."""

    @pytest.mark.parametrize("count", [None, 3])
    def test_a_search_for_no_group_is_refused_by_name(self, make_service, count):
        from app.errors import BadInput

        with pytest.raises(BadInput) as refused:
            make_service().earliest_words({"count": count, "start": NOW, "duration": H})
        assert str(refused.value) == f"a group is 1, 2, 4 or 8 cards, not {count}"


@sqlite_only  # the calendar in memory is SQLite's (app.store.bookings.Calendar)
def test_a_refusal_after_its_change_wrote_leaves_the_calendar_as_the_database(conn, make_service):
    """audited's contract for any change, even one that writes before it refuses: the write is rolled back, and the
    connection's calendar, which read the write first, reads it again."""
    rows.keep_calendar(conn, NOW - 24 * H)
    rules = make_service()
    booking = rules.create(cards=[0], start=NOW + H, end=NOW + 2 * H)

    def ends() -> list[int]:
        return [b.end for b in rows.live_between(conn, booking.start, booking.end + H)]

    def change(now: int) -> int:
        rows.set_times(conn, booking.id, booking.start, booking.end + H)
        assert ends() == [booking.end + H]
        raise Conflict("refused after writing")

    with pytest.raises(Conflict, match="refused after writing"):
        rules.audited("extend", {}, change)
    assert ends() == [booking.end]

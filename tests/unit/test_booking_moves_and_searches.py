"""Booking rules with exact messages and times: an admin's move, the queue's searches (backfill, options, next
free, earliest), and what a refusal suggests instead. Times read in UTC: FROZEN_NOW is Sunday 2026-11-29 15:30."""

from __future__ import annotations

import os
from msgspec.structs import replace

import pytest

from app.config import ClassWindow, Config, Policy, Pool
from app.core import policy
from app.core.identity import Identity
from app.errors import BadInput, Conflict, NotPermitted
from app.gpu.model import GpuProcess
from app.service.rules.bookings import BookingService
from app.store import bookings as rows
from app.store import events
from tests.conftest import FROZEN_NOW, worded

H = 3600
NOW = FROZEN_NOW


@pytest.fixture(autouse=True)
def _utc(set_tz):
    set_tz("UTC")


def last_event(conn, booking_id):
    return events.recent(conn, 1, booking_id=booking_id)[0]


class TestMove:
    def admin(self, make_service, config=None):
        return make_service("root", 0, admin=True, config=config)

    def test_a_move_sets_the_times_audits_both_and_tells_the_holder(self, make_service, conn):
        booking = make_service().create(cards=[3], start=NOW + 2 * H, end=NOW + 3 * H)
        admin = self.admin(make_service)
        moved = admin.move(booking.id, NOW + 4 * H, NOW + 5 * H)
        assert (moved.id, moved.start, moved.end, moved.cards) == (booking.id, NOW + 4 * H, NOW + 5 * H, (3,))
        assert worded(moved.notice) == "moved from 17:30-18:30 to 19:30-20:30 by admin root"
        assert [(uid, worded(told)) for uid, told in admin.told] == [
            (1001, f"booking {booking.id} was moved from 17:30-18:30 to 19:30-20:30 by admin root")]
        event = last_event(conn, booking.id)
        assert (event.action, event.actor, event.ok) == ("move", "root", True)
        assert event.details == {"start": NOW + 4 * H, "end": NOW + 5 * H, "old_start": NOW + 2 * H, "old_end": NOW + 3 * H}

    def test_only_admins_move(self, make_service, conn):
        alice = make_service()
        booking = alice.create(cards=[3], start=NOW + 2 * H, end=NOW + 3 * H)
        with pytest.raises(NotPermitted) as refused:
            alice.move(booking.id, NOW + 4 * H, NOW + 5 * H)
        assert str(refused.value) == "only admins (group board-admin) can move bookings"
        event = last_event(conn, booking.id)
        assert (event.action, event.ok, event.details["refused"]) == ("move", False, str(refused.value))

    def test_a_booking_that_has_started_keeps_its_start(self, make_service, conn):
        booking = make_service().create(cards=[3], start=NOW, end=NOW + H)
        admin = self.admin(make_service)
        with pytest.raises(BadInput) as refused:
            admin.move(booking.id, NOW + H, NOW + 2 * H)
        assert worded(refused.value) == (f"booking {booking.id} started at 15:30; only its end can move (--until),"
                                      " or reassign it")
        assert admin.move(booking.id, NOW, NOW + 2 * H).end == NOW + 2 * H  # the end alone may move

    def test_a_start_in_the_past_is_refused_but_the_grace_minute_is_not(self, make_service):
        booking = make_service().create(cards=[3], start=NOW + 2 * H, end=NOW + 3 * H)
        admin = self.admin(make_service)
        with pytest.raises(BadInput) as refused:
            admin.move(booking.id, NOW - 61, NOW + H)
        assert worded(refused.value) == "the start 15:28 is in the past; pick a start from now on"
        assert admin.move(booking.id, NOW - 60, NOW + H).start == NOW - 60

    def test_the_end_must_be_after_the_start(self, make_service):
        booking = make_service().create(cards=[3], start=NOW + 2 * H, end=NOW + 3 * H)
        with pytest.raises(BadInput) as refused:
            self.admin(make_service).move(booking.id, NOW + 3 * H, NOW + 3 * H)
        assert worded(refused.value) == "the end 18:30 (in 3 h) must be after the start 18:30 (in 3 h) and after now"

    def test_the_new_times_must_be_free_of_others_but_may_overlap_the_old_ones(self, make_service, conn):
        booking = make_service().create(cards=[3], start=NOW + 2 * H, end=NOW + 3 * H)
        bob = make_service("bob", 1002).create(cards=[3], start=NOW + 5 * H, end=NOW + 6 * H)
        admin = self.admin(make_service)
        for start, end in ((NOW + 4 * H, NOW + 5 * H + 1), (NOW + 5 * H, NOW + 6 * H), (NOW + 6 * H - 1, NOW + 7 * H)):
            with pytest.raises(Conflict) as refused:
                admin.move(booking.id, start, end)
            assert worded(refused.value) == f"card 3 is booked by bob from 20:30 (in 5 h) to 21:30 (booking {bob.id})"
        assert last_event(conn, booking.id).ok is False  # the refusal is filed under the booking moved
        assert admin.move(booking.id, NOW + 2 * H + 1800, NOW + 3 * H + 1800).start == NOW + 2 * H + 1800

    def test_the_holders_limit_applies_with_the_holders_other_bookings_only(self, make_service):
        limit = Config(policy=Policy(max_cards_per_user=2))
        alice = make_service(config=limit)
        booking = alice.create(cards=[3], start=NOW + 2 * H, end=NOW + 3 * H)
        alice.create(cards=[0, 1], start=NOW + 4 * H, end=NOW + 5 * H)
        make_service("bob", 1002, config=limit).create(cards=[4, 5], start=NOW + 6 * H, end=NOW + 7 * H)
        admin = self.admin(make_service, limit)
        with pytest.raises(NotPermitted) as refused:
            admin.move(booking.id, NOW + 4 * H, NOW + 5 * H)
        assert str(refused.value) == "you would hold 3 cards at once; the limit is 2"
        assert admin.move(booking.id, NOW + 6 * H, NOW + 7 * H).start == NOW + 6 * H  # bob's cards are not hers

    def test_the_pools_rules_apply_to_the_bookings_class_unless_overridden(self, make_service, conn):
        day = ClassWindow(9 * 60, 19 * 60, weekends=False)
        lab = Config(pools=(Pool("lab", (3,), classes=("batch",), windows={"batch": day}),))
        booking = make_service(config=lab).create(cards=[3], start=NOW + 20 * H, end=NOW + 21 * H, klass="batch")
        admin = self.admin(make_service, lab)
        assert admin.move(booking.id, NOW + 19 * H, NOW + 20 * H).start == NOW + 19 * H  # Mon 10:30, inside
        with pytest.raises(NotPermitted) as refused:
            admin.move(booking.id, NOW + 28 * H, NOW + 29 * H)
        assert worded(refused.value) == "card 3: class batch is allowed on pool lab only 09:00-19:00 (UTC)"
        moved = admin.move(booking.id, NOW + 28 * H, NOW + 29 * H, override_policy=True)
        assert moved.start == NOW + 28 * H
        assert last_event(conn, booking.id).details == {"start": NOW + 28 * H, "end": NOW + 29 * H, "override_policy": True,
                                                        "old_start": NOW + 19 * H, "old_end": NOW + 20 * H}


class TestBackfill:
    def backfill(self, make_service, config=None):
        return make_service("root", 0, admin=True, config=config).backfill()

    def test_the_round_that_confirms_nothing_more_moves_searches_only_who_could_use_the_freed_time(
            self, make_service, monkeypatch):
        """Five bookings queued one behind the other on the whole fleet all move up in the first round; a later
        round looks only at bookings before a mover in the order that end after the start it left (the others
        were searched with that time free already), so here it searches none: five searches, not ten."""
        from app.service.rules.bookings import BookingService

        blocker = make_service("bob", 1002).create(cards=range(8), start=NOW, end=NOW + 10 * H)
        queued = [make_service(f"user{n}", 2000 + n).create(cards=range(8), start=NOW + 60, end=NOW + 60 + H,
                                                            or_later=True) for n in range(5)]
        assert [b.start for b in queued] == [NOW + 10 * H + n * H for n in range(5)]
        make_service("bob", 1002).cancel(blocker.id)
        searches = []
        earliest = BookingService._earliest

        def counted(self, **search):
            searches.append(search["excluding"])
            return earliest(self, **search)

        monkeypatch.setattr(BookingService, "_earliest", counted)
        moved = self.backfill(make_service)
        assert [after.start for _, after in moved] == [NOW + 60 + n * H for n in range(5)]
        assert searches == [b.id for b in queued]

    def test_a_move_up_is_noted_audited_as_board_and_told_to_the_holder(self, make_service, conn):
        every = Config(pools=(Pool("all", tuple(range(8))),))  # a pool of every card: the move checks its classes
        blocker = make_service("bob", 1002, config=every).create(cards=[0], start=NOW, end=NOW + 2 * H)
        # Three hours, so its new slot overlaps the one it leaves.
        queued = make_service(config=every).create(cards=[0], start=NOW + 60, end=NOW + 60 + 3 * H, or_later=True)
        assert (queued.start, queued.queued) == (NOW + 2 * H, "time")
        make_service("bob", 1002, config=every).cancel(blocker.id)
        admin = make_service("root", 0, admin=True, config=every)
        moved = admin.backfill()
        assert [(before.start, after.start, after.end) for before, after in moved] == [(NOW + 2 * H, NOW + 60, NOW + 60 + 3 * H)]
        assert worded(moved[0][1].notice) == "moved up from 17:30 by backfill"
        assert [(uid, worded(told)) for uid, told in admin.told] == [
            (1001, f"booking {queued.id} was moved up from 17:30 by backfill: now 15:31 (in 1 min)"
                                     " on cards 0")]
        event = last_event(conn, queued.id)
        assert (event.action, event.actor, event.ok, event.uid) == ("backfill", "board", True, os.getuid())
        assert event.details == {"old_start": NOW + 2 * H, "old_cards": [0], "start": NOW + 60, "end": NOW + 60 + 3 * H,
                                 "cards": [0]}

    def test_the_queue_goes_on_past_bookings_that_cannot_or_need_not_move(self, make_service, conn):
        bob = make_service("bob", 1002)
        blocker = bob.create(cards=[0], start=NOW, end=NOW + 2 * H)
        bob.create(cards=[1], start=NOW, end=NOW + 2 * H)
        at_wanted = make_service("dave", 1004).create(cards=[3], start=NOW + 60, end=NOW + H, klass="online", or_later=True)
        stuck = make_service("carol", 1003).create(cards=[1], start=NOW + 60, end=NOW + H, klass="online", or_later=True)
        queued = make_service().create(cards=[0], start=NOW + 60, end=NOW + H, or_later=True)
        assert (at_wanted.start, stuck.start, queued.start) == (NOW + 60, NOW + 2 * H, NOW + 2 * H)
        bob.cancel(blocker.id)
        moved = self.backfill(make_service)  # online first: dave's is where it wanted, carol's cannot move yet
        assert [(after.id, after.start) for _, after in moved] == [(queued.id, NOW + 60)]

    def test_a_booking_on_cards_outside_the_view_is_left_and_the_rest_move(self, make_service, conn, fleet):
        bob = make_service("bob", 1002)
        blocker = bob.create(cards=[0, 7], start=NOW, end=NOW + 2 * H)
        elsewhere = make_service("carol", 1003).create(cards=[7], start=NOW + 60, end=NOW + H, klass="online", or_later=True)
        queued = make_service().create(cards=[0], start=NOW + 60, end=NOW + H, or_later=True)
        bob.cancel(blocker.id)
        seven = BookingService(conn, Identity("root", 0, True), Config(), fleet.cards[:7], fleet.topology, lambda: NOW)
        assert [after.id for _, after in seven.backfill()] == [queued.id]
        assert rows.get(conn, elsewhere.id).start == NOW + 2 * H

    def test_a_card_replaced_since_is_recorded_before_a_queued_count_moves_onto_it(self, make_service, conn, fleet):
        bob = make_service("bob", 1002)
        bob.create(cards=[0, 1, 2, 3], start=NOW, end=NOW + 2 * H)
        lab = bob.create(cards=[4, 5, 6, 7], start=NOW, end=NOW + 3 * H)
        queued = make_service().create(count=4, start=NOW + 120, end=NOW + H + 120, or_later=True)
        bob.cancel(lab.id)
        swapped = [replace(c, uuid="GPU-replacement") if c.index == 7 else c for c in fleet.cards]
        BookingService(conn, Identity("root", 0, True), Config(), swapped, fleet.topology, lambda: NOW).backfill()
        after = rows.get(conn, queued.id)
        assert (after.start, after.cards, after.card_uuids[-1]) == (NOW + 120, (4, 5, 6, 7), "GPU-replacement")
        assert conn.execute("SELECT idx, seen_at FROM cards WHERE uuid = 'GPU-replacement'").fetchone() == (7, NOW)

    def test_a_move_that_frees_time_for_one_earlier_in_the_order_is_followed_in_the_same_call(self, make_service, conn):
        blocker = make_service("bob", 1002).create(cards=[0], start=NOW, end=NOW + 2 * H)
        short = make_service().create(cards=[0], start=NOW + 60, end=NOW + 60 + H, or_later=True)
        long = make_service("carol", 1003).create(cards=[0], start=NOW + 60, end=NOW + 60 + 2 * H, klass="online",
                                                  or_later=True)
        assert (short.start, long.start) == (NOW + 2 * H, NOW + 3 * H)
        make_service("bob", 1002).cancel(blocker.id)
        self.backfill(make_service)
        # Online first, but two hours do not fit before 17:30; the hour does, and then the two hours fit after it.
        assert (rows.get(conn, short.id).start, rows.get(conn, long.id).start) == (NOW + 60, NOW + 60 + H)

    def test_only_the_holders_own_bookings_count_to_the_holders_limit(self, make_service, conn):
        limit = Config(policy=Policy(max_cards_per_user=2))
        blocker = make_service("bob", 1002, config=limit).create(cards=[0], start=NOW, end=NOW + 2 * H)
        make_service("carol", 1003, config=limit).create(cards=[4, 5], start=NOW, end=NOW + 2 * H)
        queued = make_service(config=limit).create(cards=[0], start=NOW + 60, end=NOW + H, or_later=True)
        make_service("bob", 1002, config=limit).cancel(blocker.id)
        self.backfill(make_service, limit)
        assert rows.get(conn, queued.id).start == NOW + 60

    @pytest.mark.parametrize("now_refused", ["lowered card limit", "changed window"])
    def test_a_queued_booking_whose_own_slot_the_rules_now_refuse_is_never_moved_later(self, make_service, conn,
                                                                                         now_refused):
        """Its slot at 17:30 broke no rule when it was queued; now the earliest slot the rules accept is later
        (18:30 once alice's other two cards are free; 19:00 when the experiment window opens). It stays put."""
        bob = make_service("bob", 1002)
        bob.create(cards=[0], start=NOW, end=NOW + 2 * H)
        queued = make_service().create(cards=[0], start=NOW + 60, end=NOW + 60 + H, or_later=True)
        make_service().create(cards=[4, 5], start=NOW + 2 * H, end=NOW + 3 * H)
        assert (queued.start, queued.queued) == (NOW + 2 * H, "time")
        night = Pool("all", tuple(range(8)), windows={"experiment": NIGHT})  # 19:00-07:00, a Sunday too
        now = Config(policy=Policy(max_cards_per_user=2)) if now_refused == "lowered card limit" else Config(pools=(night,))
        assert self.backfill(make_service, now) == []
        after = rows.get(conn, queued.id)
        assert (after.start, after.end, after.cards, after.notice) == (NOW + 2 * H, NOW + 3 * H, (0,), None)

    def test_a_queued_count_whose_cards_someone_now_squats_is_never_moved_later(self, make_service, conn, fleet):
        """Wanted now, so other users' processes keep it off their cards at every start; carol's now run on all of
        cards 0-3, and 4-7 are bob's until 19:30. The earliest slot the rules accept is later than its own: it stays."""
        bob = make_service("bob", 1002)
        bob.create(cards=[0, 1, 2, 3], start=NOW, end=NOW + 2 * H)
        bob.create(cards=[4, 5, 6, 7], start=NOW, end=NOW + 4 * H)
        queued = make_service().create(count=2, start=NOW, end=NOW + H, or_later=True)
        assert (queued.start, queued.queued) == (NOW + 2 * H, "cards") and set(queued.cards) <= {0, 1, 2, 3}
        carol = GpuProcess(43000, 8000, "carol", 1003, "python sweep.py")
        squatted = [replace(c, processes=(*c.processes, carol)) if c.index < 4 else c for c in fleet.cards]
        admin = BookingService(conn, Identity("root", 0, True), Config(), squatted, fleet.topology, lambda: NOW)
        assert admin.backfill() == []
        after = rows.get(conn, queued.id)
        assert (after.start, after.cards, after.notice) == (NOW + 2 * H, queued.cards, None)

    def test_moved_to_now_a_count_keeps_clear_of_other_users_processes_but_not_the_holders(self, make_service, conn):
        blocker = make_service("bob", 1002).create(cards=list(range(8)), start=NOW, end=NOW + 2 * H)
        queued = make_service().create(count=2, start=NOW, end=NOW + H, or_later=True)
        make_service("bob", 1002).cancel(blocker.id)
        self.backfill(make_service)
        after = rows.get(conn, queued.id)
        assert (after.start, after.cards) == (NOW, (0, 1))  # alice's own processes run on cards 0 and 1


NIGHT = ClassWindow(19 * 60, 7 * 60, weekends=False)


class TestOptions:
    def test_three_by_default_each_free_until_the_next_booking_begins_on_its_cards(self, make_service):
        bob = make_service("bob", 1002)
        for hour in (0, 2, 4, 6):
            bob.create(cards=list(range(8)), start=NOW + hour * H, end=NOW + (hour + 1) * H)
        found = make_service().options(8, "experiment", NOW, H)
        # Every slot is on the same eight cards: a later one is offered because the one before it is cut short.
        assert [(plan.start, until) for plan, until in found] == [(NOW + H, NOW + 2 * H), (NOW + 3 * H, NOW + 4 * H),
                                                                  (NOW + 5 * H, NOW + 6 * H)]

    def test_a_window_that_opens_later_is_a_slot(self, make_service):
        evenings = Config(policy=Policy(timezone="UTC"), pools=(Pool("all", tuple(range(8)), windows={"finetune": NIGHT}),))
        found = make_service(config=evenings).options(1, "finetune", NOW, H)
        assert [(plan.start, plan.end, until) for plan, until in found] == [(NOW + 3 * H + 1800, NOW + 4 * H + 1800, None)]


    def test_a_window_that_opens_exactly_at_the_horizon_is_offered_as_next_free_finds_it(self, make_service):
        tea = Config(policy=Policy(timezone="UTC", max_ahead_days=1),
                     pools=(Pool("all", tuple(range(8)), windows={"finetune": ClassWindow(930, 1050, weekends=False)}),))
        make_service("bob", 1002, config=tea).create(cards=list(range(8)), start=NOW, end=NOW + 3 * H)
        found = make_service(config=tea).options(8, "finetune", NOW, H)
        assert [(plan.start, until) for plan, until in found] == [(NOW + 86400, None)]

class TestNextFree:
    def test_the_classes_window_decides_when_the_cards_are_next_free(self, make_service):
        lab = Config(policy=Policy(timezone="UTC"),
                     pools=(Pool("lab", (3,), classes=("batch",), windows={"batch": NIGHT}),))
        assert make_service(config=lab).next_free([3], NOW, H, klass="batch") == NOW + 3 * H + 1800  # 19:00

    def test_the_booking_being_moved_does_not_stand_in_its_own_way(self, make_service):
        alice = make_service()
        booking = alice.create(cards=[3], start=NOW + H, end=NOW + 2 * H)
        assert alice.next_free([3], NOW + H, H, excluding=booking.id) == NOW + H
        assert alice.next_free([3], NOW + H, H) == NOW + 2 * H

    def test_none_when_no_start_works(self, make_service):
        short = Config(policy=Policy(max_booking_hours=2.0))
        assert make_service(config=short).next_free([3], NOW, 3 * H) is None


class TestEarliest:
    def test_a_window_that_opens_exactly_at_the_horizon_is_still_a_start(self, make_service):
        # The window opens at 15:30; today's is taken, and tomorrow's is exactly one day (max_ahead_days) ahead.
        tea = Config(policy=Policy(timezone="UTC", max_ahead_days=1),
                     pools=(Pool("all", tuple(range(8)), windows={"finetune": ClassWindow(930, 1050, weekends=False)}),))
        make_service("bob", 1002, config=tea).create(cards=[0], start=NOW, end=NOW + 3 * H)
        assert make_service(config=tea).next_free([0], NOW, H, klass="finetune") == NOW + 86400

    def test_past_the_first_day_the_holders_own_bookings_still_count(self, make_service):
        one = Config(policy=Policy(max_cards_per_user=1))
        make_service("bob", 1002, config=one).create(cards=[3], start=NOW, end=NOW + 48 * H)
        make_service(config=one).create(cards=[0], start=NOW + 48 * H, end=NOW + 49 * H)
        assert make_service(config=one).next_free([3], NOW, H) == NOW + 49 * H  # not 48 h: card 0 is hers then

    def test_other_users_bookings_do_not_count_to_the_callers_limit(self, make_service):
        one = Config(policy=Policy(max_cards_per_user=1))
        make_service("bob", 1002, config=one).create(cards=[0], start=NOW, end=NOW + H)
        assert make_service(config=one).next_free([3], NOW, H) == NOW

    def test_the_booking_being_moved_does_not_count_to_its_holders_limit(self, make_service):
        one = Config(policy=Policy(max_cards_per_user=1))
        alice = make_service(config=one)
        booking = alice.create(cards=[3], start=NOW + H, end=NOW + 2 * H)
        assert alice.next_free([4], NOW + H, H, excluding=booking.id) == NOW + H

    def test_asked_for_now_the_cards_with_other_users_processes_stay_out_of_later_starts_too(self, make_service):
        # Free now: only cards 2, 5 and 6, where bob's, dave's and an unnamed process run.
        blocker = make_service("bob", 1002).create(cards=[0, 1, 3, 4, 7], start=NOW, end=NOW + 2 * H)
        booking, notes = make_service().book(count=1, start=NOW + 60, end=NOW + 60 + H, or_later=True)
        assert (booking.start, booking.cards) == (NOW + 2 * H, (0,))
        assert worded(notes[0]) == "starts later than asked: no card is free for an experiment booking at 15:31 (in 1 min):" \
            f" cards 0,1,3,4,7 are booked by bob until 17:30 (in 2 h) (booking {blocker.id}); passed over card 2" \
            " (bob's processes, 23.9 GiB), card 5 (dave's processes, 8.8 GiB), card 6 (container/unknown's processes, 4.0 GiB)"


class TestRefusals:
    def test_a_class_no_pool_allows_names_each_pool_once(self, make_service):
        online = Config(pools=(Pool("a", (0, 1, 2, 3), classes=("online",)), Pool("b", (4, 5, 6, 7), classes=("online",))))
        with pytest.raises(NotPermitted) as refused:
            make_service(config=online).create(count=1, start=NOW + H, end=NOW + 2 * H)
        assert worded(refused.value) == (
            "1 card for a 1h experiment booking from 16:30 (in 60 min): the rules allow none: class experiment is not"
            " allowed on pool a (cards 0,1,2,3); class experiment is not allowed on pool b (cards 4,5,6,7);"
            " no start within 30 days works either")

    def test_named_cards_the_pool_refuses(self, make_service):
        lab = Config(pools=(Pool("lab", (3,), classes=("batch",)),))
        with pytest.raises(NotPermitted) as refused:
            make_service(config=lab).create(cards=[3], start=NOW + H, end=NOW + 2 * H)
        assert str(refused.value) == ("card 3: class experiment is not allowed on pool lab (cards 3);"
                                      " no start within 30 days works either")

    def test_the_pools_refusal_comes_before_whoever_holds_the_card(self, make_service):
        lab = Config(pools=(Pool("lab", (3,), classes=("batch",)),))
        make_service("bob", 1002, config=lab).create(cards=[3], start=NOW + H, end=NOW + 2 * H, klass="batch")
        with pytest.raises(NotPermitted) as refused:
            make_service(config=lab).create(cards=[3], start=NOW + H, end=NOW + 2 * H)
        assert str(refused.value).startswith("card 3: class experiment is not allowed on pool lab (cards 3);")

    @pytest.mark.parametrize("taken", [3, 4])
    def test_at_most_three_holders_are_named_then_an_ellipsis(self, make_service, taken):
        bob = make_service("bob", 1002)
        ids = [bob.create(cards=[i], start=NOW, end=NOW + 2 * H).id for i in range(taken)]
        with pytest.raises(Conflict) as refused:
            make_service().create(count=8, start=NOW + H, end=NOW + 2 * H, klass="batch")
        holders = [f"card {i} is booked by bob until 17:30 (in 2 h) (booking {ids[i]})" for i in range(3)]
        shown = "; ".join(holders + (["…"] if taken > 3 else []))
        assert worded(refused.value) == (f"no 8 cards are free for a batch booking at 16:30 (in 60 min): {shown};"
                                      " the earliest start that works: 17:30 (in 2 h) on cards 0,1,2,3,4,5,6,7"
                                      " (--or-later takes it)")

    def test_one_card_is_suggested_as_a_card(self, make_service):
        booking = make_service("bob", 1002).create(cards=list(range(8)), start=NOW, end=NOW + 2 * H)
        with pytest.raises(Conflict) as refused:
            make_service().create(count=1, start=NOW + H, end=NOW + 2 * H)
        assert worded(refused.value).endswith("; the earliest start that works: 17:30 (in 2 h) on card 0 (--or-later takes"
                                           " it)")
        assert f"(booking {booking.id})" in worded(refused.value)


def test_a_split_by_reassign_leaves_the_notice_on_both_pieces(make_service, conn):
    booking = make_service().create(cards=[3], start=NOW - 30, end=NOW + H)
    admin = make_service("root", 0, admin=True)
    piece = admin.reassign(booking.id, cards=[4])
    what = f"moved to card 4 by admin root (from now on booking {piece.id})"  # one card: not "cards 4"
    assert (rows.get(conn, booking.id).notice, piece.notice) == (what, what)
    assert admin.told == [(1001, f"booking {booking.id} was {what}")]
    two = make_service().create(cards=[0, 1], start=NOW + H, end=NOW + 2 * H)
    assert admin.reassign(two.id, cards=[5, 6]).notice == "moved to cards 5,6 by admin root"


class TestWindowOpens:
    def test_openings_fall_on_the_minute_whatever_the_seconds_of_the_start(self):
        config = Config(policy=Policy(timezone="UTC"), pools=(Pool("p", (0,), windows={"finetune": NIGHT}),))
        assert policy.window_opens(config, "finetune", NOW + 17, NOW + 86400) == [NOW + 3 * H + 1800]

    def test_the_span_includes_its_start_and_not_its_end(self):
        config = Config(policy=Policy(timezone="UTC"), pools=(Pool("p", (0,), windows={"finetune": NIGHT}),))
        seven = NOW + 3 * H + 1800
        assert policy.window_opens(config, "finetune", seven, seven + 86400) == [seven]
        assert policy.window_opens(config, "finetune", NOW, seven) == []

    def test_a_window_without_weekends_does_not_open_at_saturday_midnight(self):
        config = Config(policy=Policy(timezone="UTC"), pools=(Pool("p", (0,), windows={"batch": NIGHT}),))
        friday = NOW + 5 * 86400  # Friday 15:30
        assert policy.window_opens(config, "batch", friday, friday + 86400) == [friday + 3 * H + 1800]


def test_or_later_with_no_start_that_works_is_refused_with_the_rules_reason(make_service, conn):
    online = Config(pools=(Pool("all", tuple(range(8)), classes=("online",)),))
    with pytest.raises(NotPermitted) as refused:
        make_service(config=online).book(count=1, start=NOW + H, end=NOW + 2 * H, or_later=True)
    assert worded(refused.value) == (
        "1 card for a 1h experiment booking from 16:30 (in 60 min): the rules allow none: class experiment is not"
        " allowed on pool all (cards 0,1,2,3,4,5,6,7); no start within 30 days works either")
    assert rows.listing(conn, start=None, end=None, user=None, include_cancelled=True) == []


class TestAdminChangesTellTheHolder:
    """An admin's extend, cancel and release on someone else's booking: the holder's notice, what the service
    publishes to them, and the audit row's details. NOW is Sunday 15:30 UTC."""

    def test_an_extend_audits_both_ends_and_tells_the_holder(self, make_service, conn):
        booking = make_service().create(cards=[3], start=NOW + 2 * H, end=NOW + 3 * H)
        admin = make_service("root", 0, admin=True)
        extended = admin.extend(booking.id, NOW + 4 * H)
        assert (extended.start, extended.end, worded(extended.notice)) == (NOW + 2 * H, NOW + 4 * H,
                                                                           "extended to 19:30 by admin root")
        assert [(uid, worded(told)) for uid, told in admin.told] == [
            (1001, f"booking {booking.id} was extended to 19:30 by admin root")]
        event = last_event(conn, booking.id)
        assert (event.action, event.ok, event.details) == ("extend", True, {"end": NOW + 4 * H, "old_end": NOW + 3 * H})

    @pytest.mark.parametrize("how", ["cancel", "release"])
    def test_a_cancel_or_release_tells_the_holder(self, make_service, how):
        start = NOW + 2 * H if how == "cancel" else NOW  # only a booking that has started is released
        booking = make_service().create(cards=[3], start=start, end=start + H)
        admin = make_service("root", 0, admin=True)
        ended = getattr(admin, how)(booking.id)
        what = f"{'cancelled' if how == 'cancel' else 'released'} by admin root"
        assert ended.notice == what and admin.told == [(1001, f"booking {booking.id} was {what}")]

    def test_an_extend_is_checked_against_the_bookings_class(self, make_service):
        """The pool's window is the finetune class's: a finetune booking may grow inside it, and not past it."""
        night = ClassWindow(19 * 60, 7 * 60)  # at weekends too: NOW is a Sunday
        evenings = Config(policy=Policy(timezone="UTC"), pools=(Pool("all", tuple(range(8)), windows={"finetune": night}),))
        alice = make_service(config=evenings)
        booking = alice.create(cards=[3], start=NOW + 4 * H, end=NOW + 5 * H, klass="finetune")  # 19:30-20:30
        assert alice.extend(booking.id, NOW + 6 * H).end == NOW + 6 * H
        with pytest.raises(NotPermitted, match="finetune"):
            alice.extend(booking.id, NOW + 17 * H)  # 08:30 on Monday, past the window

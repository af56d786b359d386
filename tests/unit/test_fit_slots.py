"""Where and when a request fits (board fit --for): BookingService.options and the `slots` operation."""

import pytest

from app.config import Config, Pool, Policy
from app.core.identity import Identity
from app.errors import BadInput
from app.service.rules.bookings import BookingService
from tests.conftest import FROZEN_NOW
from tests.unit.test_booking_sees_cards import bobs, cards

H = 3600
NOW = FROZEN_NOW


@pytest.fixture
def rules(conn, fleet):
    def make(readings, name="alice", uid=1001, config=None):
        return BookingService(conn, Identity(name, uid, False), config or Config(), readings, fleet.topology, lambda: NOW)

    return make


class TestOptions:
    def test_an_idle_machine_offers_one_slot_now(self, rules):
        found = rules(cards()).options(2, "experiment", NOW, 3 * H)
        assert [(p.cards, p.start, until) for p, until in found] == [((0, 1), NOW, None)]

    def test_a_slot_cut_short_is_followed_by_a_later_one(self, rules):
        svc = rules(cards(count=4))
        svc.book(cards=[0, 1], start=NOW, end=NOW + 8 * H)
        svc.book(cards=[2, 3], start=NOW + 4 * H, end=NOW + 8 * H)
        found = rules(cards(count=4), name="bob", uid=1002).options(2, "experiment", NOW, 3 * H)
        assert [(p.cards, p.start, until) for p, until in found] == [((2, 3), NOW, NOW + 4 * H), ((0, 1), NOW + 8 * H, None)]

    def test_a_later_slot_on_cards_already_free_for_good_is_not_offered(self, rules):
        svc = rules(cards(count=2))
        svc.book(cards=[0, 1], start=NOW, end=NOW + 2 * H)
        svc.book(cards=[0], start=NOW + 30 * H, end=NOW + 31 * H)
        found = rules(cards(count=2), name="bob", uid=1002).options(2, "experiment", NOW, 3 * H)
        assert [(p.cards, p.start) for p, _ in found] == [((0, 1), NOW + 2 * H)]

    def test_free_until_is_when_the_next_booking_on_those_cards_starts(self, rules):
        svc = rules(cards(count=2))
        svc.book(cards=[0, 1], start=NOW + 10 * H, end=NOW + 12 * H)
        found = rules(cards(count=2), name="bob", uid=1002).options(2, "experiment", NOW, 3 * H)
        assert [(p.cards, p.start, until) for p, until in found][0] == ((0, 1), NOW, NOW + 10 * H)

    def test_free_until_is_the_earliest_of_the_next_bookings_on_its_cards(self, rules):
        """Two cards, each booked later at a different time: the slot lasts until the first of them. Wrong versions:
        the last of them (max for min); the first booked (card 0's, made first, starts later)."""
        svc = rules(cards(count=2))
        svc.book(cards=[0], start=NOW + 10 * H, end=NOW + 12 * H)
        svc.book(cards=[1], start=NOW + 6 * H, end=NOW + 7 * H)
        found = rules(cards(count=2), name="bob", uid=1002).options(2, "experiment", NOW, 3 * H)
        assert [(p.cards, p.start, until) for p, until in found][0] == ((0, 1), NOW, NOW + 6 * H)

    def test_a_booking_more_than_a_day_past_the_slot_is_not_a_limit(self, rules):
        svc = rules(cards(count=1))
        svc.book(cards=[0], start=NOW + 3 * H + 86400 + 1, end=NOW + 3 * H + 86400 + 2 * H)
        found = rules(cards(count=1), name="bob", uid=1002).options(1, "experiment", NOW, 3 * H)
        assert found[0][1] is None

    def test_cards_with_another_users_processes_are_not_free_now(self, rules):
        found = rules(cards({0: [bobs()], 1: [bobs()]}, count=4)).options(2, "experiment", NOW, H)
        assert found[0][0].cards == (2, 3)

    def test_a_pool_that_refuses_the_class_is_skipped(self, rules):
        config = Config(pools=(Pool(name="prod", cards=(0, 1, 2, 3), classes=("online", "batch")),))
        found = rules(cards(), config=config).options(2, "finetune", NOW, H)
        assert all(set(p.cards) <= {4, 5, 6, 7} for p, _ in found) and found

    def test_at_most_limit_options(self, rules):
        svc = rules(cards(count=2))
        for hour in range(0, 10, 2):
            svc.book(cards=[hour // 2 % 2], start=NOW + hour * H, end=NOW + (hour + 2) * H)
        found = rules(cards(count=2), name="bob", uid=1002).options(1, "experiment", NOW, H, limit=1)
        assert len(found) == 1

    def test_a_request_that_can_never_start_gives_no_slot(self, rules):
        config = Config(policy=Policy(max_booking_hours=2.0))
        assert rules(cards(), config=config).options(1, "experiment", NOW, 3 * H) == []

    @pytest.mark.parametrize("count", [0, 3, 16])
    def test_a_group_is_1_2_4_or_8(self, rules, count):
        with pytest.raises(BadInput, match="a group is 1, 2, 4 or 8"):
            rules(cards()).options(count, "experiment", NOW, H)

    def test_an_unknown_class_is_bad_input(self, rules):
        with pytest.raises(BadInput):
            rules(cards()).options(1, "party", NOW, H)

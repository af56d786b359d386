"""Booking sees the cards (issue 10, section 4): a slot that starts now passes over cards with another
user's processes and HOT cards, and says so; named cards are booked with a note."""

from msgspec.structs import replace

import pytest

from app.config import Config, Pool
from app.core.identity import Identity
from app.errors import Conflict
from app.gpu.model import CardReading, GpuProcess
from app.service.rules.bookings import PAST_GRACE_SECONDS, BookingService
from tests.conftest import FROZEN_NOW, worded

H = 3600
NOW = FROZEN_NOW
GIB = 1024


def bobs(used_mib=9 * GIB):
    return GpuProcess(pid=4711, used_mib=used_mib, user="bob", uid=1002, command="python train.py")


def alices():
    return GpuProcess(pid=4712, used_mib=2 * GIB, user="alice", uid=1001, command="python eval.py")


def containers():
    return GpuProcess(pid=4713, used_mib=4 * GIB, user=None, uid=None, command="")


def cards(processes=None, temperatures=None, count=8):
    """Eight cool, idle cards (two switches, 0-3 and 4-7), with processes and temperatures by index."""
    return [
        CardReading(index=i, uuid=f"GPU-test-{i}", memory_total_mib=32607,
                    temperature_c=(temperatures or {}).get(i, 40), processes=tuple((processes or {}).get(i, ())))
        for i in range(count)
    ]


@pytest.fixture
def service(conn, fleet):
    def make(readings, name="alice", uid=1001, now=NOW, config=None):
        return BookingService(conn, Identity(name, uid, False), config or Config(), readings, fleet.topology,
                              lambda: now)

    return make


class TestPickingByCount:
    def test_clean_cool_cards_are_picked_without_a_note(self, service):
        booking, notes = service(cards()).book(count=2, start=NOW, end=NOW + H)
        assert (booking.cards, notes) == ((0, 1), ())

    def test_another_users_processes_are_passed_over(self, service):
        booking, notes = service(cards({0: [bobs()]})).book(count=2, start=NOW, end=NOW + H)
        assert booking.cards == (1, 2)
        assert notes == ("passed over card 0 (bob's processes, 9.0 GiB)",)

    def test_another_users_uid_counts_whatever_the_name(self, service):
        impostor = GpuProcess(pid=1, used_mib=GIB, user="alice", uid=1002, command="")
        booking, notes = service(cards({0: [impostor]})).book(count=1, start=NOW, end=NOW + H)
        assert booking.cards == (1,)
        assert notes == ("passed over card 0 (alice's processes, 1.0 GiB)",)

    def test_own_processes_do_not_disqualify(self, service):
        booking, notes = service(cards({0: [alices()], 1: [alices()]})).book(count=2, start=NOW, end=NOW + H)
        assert (booking.cards, notes) == ((0, 1), ())

    def test_a_container_process_is_someone_elses_on_a_card_not_held(self, service):
        booking, notes = service(cards({0: [containers()]})).book(count=1, start=NOW, end=NOW + H)
        assert booking.cards == (1,)
        assert notes == ("passed over card 0 (container/unknown's processes, 4.0 GiB)",)

    def test_a_container_process_may_be_the_holders_own(self, service):
        readings = cards({0: [containers()]})
        service(readings, now=NOW - H).create(cards=[0], start=NOW - H, end=NOW + 10)  # held now, free in the grace
        booking, notes = service(readings).book(count=1, start=NOW + 10, end=NOW + H)
        assert (booking.cards, notes) == ((0,), ())

    @pytest.mark.parametrize("user, passed_over", [("bob", True), ("alice", False)])
    def test_without_a_uid_the_name_decides(self, service, user, passed_over):
        nameless = GpuProcess(pid=1, used_mib=GIB, user=user, uid=None, command="")
        booking, notes = service(cards({0: [nameless]})).book(count=1, start=NOW, end=NOW + H)
        if passed_over:
            assert (booking.cards, notes) == ((1,), ("passed over card 0 (bob's processes, 1.0 GiB)",))
        else:
            assert (booking.cards, notes) == ((0,), ())

    def test_processes_of_several_users_and_unknown_memory(self, service):
        readings = cards({0: [bobs(None), containers()], 1: [bobs(None)]})
        booking, notes = service(readings).book(count=1, start=NOW, end=NOW + H)
        assert booking.cards == (2,)
        assert notes == ("passed over card 0 (bob's and container/unknown's processes, 4.0 GiB),"
                         " card 1 (bob's processes)",)

    def test_a_card_booked_anyway_is_not_named(self, service):
        readings = cards({0: [bobs()]})
        service(readings, "bob", 1002).create(cards=[0], start=NOW, end=NOW + H)
        booking, notes = service(readings).book(count=2, start=NOW, end=NOW + H)
        assert (booking.cards, notes) == ((1, 2), ())

    def test_a_card_passed_over_now_is_named_when_the_booking_waits(self, service):
        readings = cards({0: [bobs()]}, count=2)
        service(readings, "carol", 1003).create(cards=[1], start=NOW, end=NOW + H)
        carols = service(readings, "bob", 1002).create(cards=[0], start=NOW + H, end=NOW + 2 * H).id - 1
        booking, notes = service(readings).book(count=1, start=NOW, end=NOW + H, or_later=True)
        assert (booking.cards, booking.start) == ((1,), NOW + H)
        assert tuple(map(worded, notes)) == (f"starts later than asked: no card is free for an experiment booking at"
                                             f" 15:30 (now): card 1 is booked by carol until 16:30 (in 60 min) (booking"
                                             f" {carols}); passed over card 0 (bob's processes, 9.0 GiB)",)

    def test_a_card_passed_over_at_the_later_start_is_named(self, service):
        readings = cards({0: [bobs()]}, count=2)
        service(readings, "carol", 1003).create(cards=[0, 1], start=NOW, end=NOW + H)
        booking, notes = service(readings).book(count=1, start=NOW, end=NOW + H, or_later=True)
        assert (booking.cards, booking.start) == ((1,), NOW + H)  # asked for now: bob's card stays out
        assert tuple(map(worded, notes)) == ("starts later than asked: no card is free for an experiment booking at"
                                             " 15:30 (now): cards 0,1 are booked by carol until 16:30 (in 60 min)"
                                             " (booking 1)", "passed over card 0 (bob's processes, 9.0 GiB)")

    def test_a_hot_card_is_passed_over_for_a_cooler_group(self, service):
        booking, notes = service(cards(temperatures={0: 93})).book(count=2, start=NOW, end=NOW + H)
        assert booking.cards == (1, 2)
        assert notes == ("passed over card 0 (93 °C)",)

    def test_hot_starts_at_the_configured_degree(self, service):
        hot = Config().hot_celsius
        booking, notes = service(cards(temperatures={0: hot})).book(count=2, start=NOW, end=NOW + H)
        assert (booking.cards, notes) == ((1, 2), (f"passed over card 0 ({hot} °C)",))

    def test_just_below_hot_is_cool(self, service):
        booking, notes = service(cards(temperatures={0: Config().hot_celsius - 1})).book(
            count=2, start=NOW, end=NOW + H)
        assert (booking.cards, notes) == ((0, 1), ())

    def test_a_hot_card_is_taken_when_no_cooler_group_can_start_then(self, service):
        readings = cards(temperatures={7: 93})
        booking, notes = service(readings).book(count=8, start=NOW, end=NOW + H)
        assert booking.cards == tuple(range(8))
        # All eight span both switches: the plan also says so (issue 23).
        assert notes == ("took card 7 though it is HOT (93 °C): no cooler group could start then",
                         "cards 0-7 cross a PCIe switch: traffic between them goes through the CPU;"
                         " prefer --split-mode layer")

    def test_two_cards_across_the_switch_get_the_note_too(self, service):
        booking, notes = service(cards()).book(cards=[3, 4], start=NOW, end=NOW + H)
        assert (booking.cards, notes) == ((3, 4), ("cards 3-4 cross a PCIe switch: traffic between them goes through"
                                                   " the CPU; prefer --split-mode layer",))

    def test_a_hot_card_free_now_beats_a_cool_one_free_later(self, service):
        readings = cards(temperatures={0: 93}, count=2)
        service(readings, "bob", 1002).create(cards=[1], start=NOW, end=NOW + H)
        booking, notes = service(readings).book(count=1, start=NOW, end=NOW + H)
        assert (booking.cards, booking.start) == ((0,), NOW)
        assert notes == ("took card 0 though it is HOT (93 °C): no cooler group could start then",)

    def test_a_hot_card_is_avoided_past_the_first_days_search_too(self, service):
        readings = cards(temperatures={0: 93}, count=2)
        service(readings, "bob", 1002).create(cards=[0, 1], start=NOW, end=NOW + 48 * H)  # longer than the lookahead
        booking, _ = service(readings).book(count=1, start=NOW, end=NOW + H, or_later=True)
        assert booking.start == NOW + 48 * H

    def test_both_reasons_in_card_order(self, service):
        readings = cards({3: [bobs()]}, temperatures={0: 93})
        booking, notes = service(readings).book(count=2, start=NOW, end=NOW + H)
        assert booking.cards == (1, 2)
        assert notes == ("passed over card 0 (93 °C), card 3 (bob's processes, 9.0 GiB)",)

    def test_a_lost_card_is_passed_over_and_named_now_and_later(self, service):
        readings = cards({3: [bobs()]})
        readings[0] = replace(readings[0], lost=True)
        booking, notes = service(readings).book(count=2, start=NOW, end=NOW + H)
        assert booking.cards == (1, 2)
        assert notes == ("passed over card 0 (LOST: fell off the bus), card 3 (bob's processes, 9.0 GiB)",)
        later = NOW + 2 * H  # what runs now no longer counts; a card that fell off the bus still does
        assert service(readings).plan(count=2, start=later, end=later + H).notes == (
            "passed over card 0 (LOST: fell off the bus)",)

    def test_a_lost_card_is_named_only_where_the_rules_would_take_it(self, service):
        """Lost cards 0 and 4: card 0's pool takes a short experiment, card 4's takes only online bookings, so only
        card 0 was passed over for being lost."""
        pools = Config(pools=(Pool("lab", (0, 1, 2, 3), ("experiment",), max_hours=12),
                              Pool("prod", (4, 5, 6, 7), ("online",))))
        readings = cards()
        for i in (0, 4):
            readings[i] = replace(readings[i], lost=True)
        booking, notes = service(readings, config=pools).book(count=2, start=NOW, end=NOW + H)
        assert (booking.cards, notes) == ((1, 2), ("passed over card 0 (LOST: fell off the bus)",))

    def test_a_future_slot_ignores_what_runs_now(self, service):
        readings = cards({0: [bobs()]}, temperatures={1: 93})
        start = NOW + PAST_GRACE_SECONDS + 1
        booking, notes = service(readings).book(count=2, start=start, end=start + H)
        assert (booking.cards, notes) == ((0, 1), ())

    def test_a_slot_within_the_grace_is_now(self, service):
        start = NOW + PAST_GRACE_SECONDS
        booking, notes = service(cards({0: [bobs()]})).book(count=1, start=start, end=start + H)
        assert (booking.cards, notes) == ((1,), ("passed over card 0 (bob's processes, 9.0 GiB)",))

    def test_nothing_clean_refuses_and_names_the_cards(self, service):
        readings = cards({i: [bobs()] for i in range(1, 8)})
        with pytest.raises(Conflict) as refused:
            service(readings).book(count=2, start=NOW, end=NOW + H)
        assert worded(refused.value) == (
            "no 2 cards are free for an experiment booking at 15:30 (now): passed over "
            + ", ".join(f"card {i} (bob's processes, 9.0 GiB)" for i in range(1, 8))
            + "; no start within 30 days works either"
        )

    def test_cards_whose_pool_refuses_the_length_are_left_out(self, service):
        short = Config(pools=(Pool("short", (0, 1, 2, 3), max_hours=2),))
        booking, notes = service(cards(), config=short).book(count=1, start=NOW, end=NOW + 3 * H)
        assert (booking.cards, notes) == ((4,), ())

    def test_plan_says_the_same(self, service):
        plan = service(cards({0: [bobs()]})).plan(count=1, start=NOW, end=NOW + H)
        assert (plan.cards, plan.notes) == ((1,), ("passed over card 0 (bob's processes, 9.0 GiB)",))

    def test_create_still_returns_the_booking(self, service):
        assert service(cards({0: [bobs()]})).create(count=1, start=NOW, end=NOW + H).cards == (1,)


class TestBookingNamedCards:
    def test_another_users_processes_are_named(self, service):
        booking, notes = service(cards({3: [bobs()]})).book(cards=[2, 3], start=NOW, end=NOW + H)
        assert booking.cards == (2, 3)
        assert notes == ("card 3 has bob's processes (9.0 GiB) now",)

    def test_unknown_memory_is_left_out(self, service):
        _, notes = service(cards({3: [bobs(None)]})).book(cards=[3], start=NOW, end=NOW + H)
        assert notes == ("card 3 has bob's processes now",)

    def test_own_processes_and_heat_say_nothing(self, service):
        _, notes = service(cards({0: [alices()]}, temperatures={0: 93})).book(cards=[0], start=NOW, end=NOW + H)
        assert notes == ()

    def test_a_card_held_from_this_very_second_is_held(self, service):
        readings = cards({0: [containers()]})
        service(readings).create(cards=[0], start=NOW, end=NOW + 10)
        _, notes = service(readings).book(cards=[0], start=NOW + 10, end=NOW + H)
        assert notes == ()

    def test_a_container_on_a_card_someone_else_held_until_the_start_is_named(self, service):
        readings = cards({0: [containers()]})
        service(readings, "bob", 1002, now=NOW - H).create(cards=[0], start=NOW - H, end=NOW + 10)
        _, notes = service(readings).book(cards=[0], start=NOW + 10, end=NOW + H)
        assert notes == ("card 0 has container/unknown's processes (4.0 GiB) now",)

    def test_my_booking_from_the_next_second_does_not_hold_the_card_now(self, service):
        readings = cards({0: [containers()]})
        service(readings).create(cards=[0], start=NOW + 1, end=NOW + H)
        _, notes = service(readings).book(cards=[0], start=NOW - 30, end=NOW + 1)
        assert notes == ("card 0 has container/unknown's processes (4.0 GiB) now",)

    def test_sizes_are_in_gib_of_1024_mib(self, service):
        # 100 GiB on one card: an H200 (141 GB) holds it.
        _, notes = service(cards({3: [bobs(100 * GIB)]})).book(cards=[3], start=NOW, end=NOW + H)
        assert notes == ("card 3 has bob's processes (100.0 GiB) now",)

    def test_a_future_slot_says_nothing(self, service):
        start = NOW + PAST_GRACE_SECONDS + 1
        _, notes = service(cards({3: [bobs()]})).book(cards=[3], start=start, end=start + H)
        assert notes == ()

    def test_a_container_on_a_card_held_now_says_nothing(self, service):
        readings = cards({0: [containers()], 1: [containers()]})
        service(readings, now=NOW - H).create(cards=[0], start=NOW - H, end=NOW + 10)
        _, notes = service(readings).book(cards=[0, 1], start=NOW + 10, end=NOW + H)
        assert notes == ("card 1 has container/unknown's processes (4.0 GiB) now",)


class TestTheBookOp:
    def test_the_result_carries_the_notes_beside_the_booking(self, service):
        from app.model import booking_to_wire
        from app.service.ops import OPS
        from app.service.ops.bookings import Book

        class Service:  # the one thing the op asks of the service
            def __init__(self, rules):
                self.rules = rules

            def bookings(self, me, host=None):
                return self.rules

        rules = service(cards({0: [bobs()]}))
        result = OPS["book"].handler(Service(rules), rules.me, Book(start=NOW, end=NOW + H, count=1))
        assert result == {**booking_to_wire(rules.get(result["id"])),
                          "notes": ["passed over card 0 (bob's processes, 9.0 GiB)"]}
        # Without notes the result is the booking as before, key for key.
        clean = OPS["book"].handler(Service(rules), rules.me, Book(start=NOW, end=NOW + H, cards=[2]))
        assert clean == booking_to_wire(rules.get(clean["id"]))

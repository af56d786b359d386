"""Each card's live state and warnings (app.core.cardstate), from hand-made readings and bookings."""

from __future__ import annotations

import pytest

from app.core.cardstate import (
    BOOKED, FREE, FULL, HOT, IN_USE, LOST, SQUATTED, UNKNOWN_USER, card_state, fleet_status, warnings,
)
from app.gpu.model import CardReading, FleetSnapshot, GpuProcess, Topology
from app.model import Booking

NOW = 1_000_000
H = 3600


def process(user: str | None, pid: int = 100) -> GpuProcess:
    """A process on the card; user None is one whose PID another namespace hides (a container)."""
    return GpuProcess(pid=pid, used_mib=1000, user=user, uid=None if user is None else 1000 + pid, command="python x")


def reading(index: int = 0, *users: str | None, lost: bool = False, **fields) -> CardReading:
    procs = tuple(process(user, pid=100 + n) for n, user in enumerate(users))
    return CardReading(index=index, uuid=f"GPU-{index}", lost=lost, processes=procs, **fields)


def booking(user: str = "alice", cards=(0,), start: int = NOW - H, end: int = NOW + H, status: str = "booked",
            id: int = 1) -> Booking:
    return Booking(id=id, user=user, uid=1001, cards=tuple(cards), card_uuids=tuple(f"GPU-{c}" for c in cards),
                   start=start, end=end, klass="experiment", note="", status=status)


class TestState:
    @pytest.mark.parametrize("users, held_by, state", [
        ((), None, FREE),
        ((), "alice", BOOKED),  # reserved and idle
        (("alice",), "alice", IN_USE),
        (("alice", "alice"), "alice", IN_USE),
        (("bob",), None, SQUATTED),  # no booking at all
        (("bob",), "alice", SQUATTED),  # someone else's booking
        (("alice", "bob"), "alice", SQUATTED),  # the holder and a stranger
        (("alice",), "bob", SQUATTED),
    ])
    def test_who_runs_against_who_holds(self, users, held_by, state):
        holder = booking(held_by) if held_by else None
        assert card_state(reading(0, *users), holder) == state

    @pytest.mark.parametrize("users, held_by", [((), None), ((), "alice"), (("alice",), "alice"), (("bob",), None),
                                                ((None,), "alice")])
    def test_a_lost_card_is_lost_whatever_runs_on_it(self, users, held_by):
        holder = booking(held_by) if held_by else None
        assert card_state(reading(0, *users, lost=True), holder) == LOST


class TestContainerProcesses:
    """A process whose PID another namespace hides has no user: the card does not hide it, whatever its state."""

    def test_on_a_free_card_it_squats(self):
        assert card_state(reading(0, None), None) == SQUATTED

    def test_on_a_booked_card_it_counts_as_use_but_is_shown_as_unknown_not_as_the_holder(self):
        # It may well be the holder's container, so the card is not SQUATTED; but nobody reads it as the holder's.
        [status] = fleet_status(FleetSnapshot(NOW, True, (reading(0, None),), Topology()), [booking("alice")], NOW)
        assert status.state == IN_USE and status.state != BOOKED
        assert status.users == (UNKNOWN_USER,) and "alice" not in status.users

    def test_beside_the_holder_both_are_shown(self):
        [status] = fleet_status(FleetSnapshot(NOW, True, (reading(0, "alice", None),), Topology()),
                                [booking("alice")], NOW)
        assert (status.state, status.users) == (IN_USE, ("alice", UNKNOWN_USER))

    def test_beside_a_stranger_the_stranger_still_squats(self):
        assert card_state(reading(0, None, "bob"), booking("alice")) == SQUATTED


class TestWarnings:
    @pytest.mark.parametrize("celsius, hot", [(None, False), (0, False), (89, False), (90, True), (91, True)])
    def test_hot_from_the_threshold_on(self, celsius, hot):
        assert (HOT in warnings(reading(temperature_c=celsius), 90)) is hot

    @pytest.mark.parametrize("used, total, full", [
        (None, 1000, False), (900, None, False), (900, 0, False),  # what the driver cannot report
        (0, 1000, False), (899, 1000, False), (900, 1000, True), (1000, 1000, True),  # exactly 90 % is FULL
        (28_990, 32_211, True), (28_989, 32_211, False),  # 90 % of 32211 is 28989.9
    ])
    def test_full_from_nine_tenths_of_the_memory_on(self, used, total, full):
        assert (FULL in warnings(reading(memory_used_mib=used, memory_total_mib=total), 90)) is full

    def test_both_at_once_in_a_fixed_order(self):
        assert warnings(reading(temperature_c=95, memory_used_mib=950, memory_total_mib=1000), 90) == (HOT, FULL)
        assert warnings(reading(temperature_c=50, memory_used_mib=10, memory_total_mib=1000), 90) == ()

    def test_fleet_status_passes_the_configured_threshold(self):
        snapshot = FleetSnapshot(NOW, True, (reading(0, temperature_c=80), reading(1, temperature_c=79)), Topology())
        assert [s.warnings for s in fleet_status(snapshot, [], NOW, hot_celsius=80)] == [(HOT,), ()]
        assert [s.warnings for s in fleet_status(snapshot, [], NOW)] == [(), ()]
        at_default = FleetSnapshot(NOW, True, (reading(0, temperature_c=90), reading(1, temperature_c=89)), Topology())
        assert [s.warnings for s in fleet_status(at_default, [], NOW)] == [(HOT,), ()]  # 90 by default


class TestFleetStatus:
    def snapshot(self, *cards: CardReading) -> FleetSnapshot:
        return FleetSnapshot(NOW, True, cards or tuple(reading(i) for i in range(3)), Topology())

    def test_current_and_next_booking_per_card(self):
        now_on_0 = booking(cards=(0, 1), start=NOW - H, end=NOW + H, id=1)
        later_on_1 = booking("bob", cards=(1,), start=NOW + 2 * H, end=NOW + 3 * H, id=2)
        latest_on_1 = booking("bob", cards=(1,), start=NOW + 4 * H, end=NOW + 5 * H, id=3)
        statuses = fleet_status(self.snapshot(), [now_on_0, latest_on_1, later_on_1], NOW)  # not in start order
        assert [(s.booking and s.booking.id, s.next_booking and s.next_booking.id) for s in statuses] == [
            (1, None), (1, 2), (None, None)]
        assert [s.state for s in statuses] == [BOOKED, BOOKED, FREE]

    def test_a_booking_holds_from_its_start_to_just_before_its_end(self):
        starts_now = booking(cards=(0,), start=NOW, end=NOW + H, id=1)
        ended_now = booking(cards=(1,), start=NOW - H, end=NOW, id=2)
        statuses = fleet_status(self.snapshot(), [starts_now, ended_now], NOW)
        assert (statuses[0].booking, statuses[0].next_booking) == (starts_now, None)
        assert (statuses[1].booking, statuses[1].next_booking) == (None, None)
        assert [s.state for s in statuses] == [BOOKED, FREE, FREE]

    def test_a_cancelled_booking_holds_nothing(self):
        cancelled = booking(cards=(0,), status="cancelled")
        [status] = fleet_status(self.snapshot(reading(0, "alice")), [cancelled], NOW)
        assert (status.booking, status.state) == (None, SQUATTED)

    def test_one_status_per_card_in_snapshot_order_with_its_state(self):
        cards = (reading(0, "alice"), reading(1), reading(2, "bob"), reading(3, lost=True))
        statuses = fleet_status(self.snapshot(*cards), [booking(cards=(0, 1))], NOW)
        assert [(s.reading.index, s.state) for s in statuses] == [(0, IN_USE), (1, BOOKED), (2, SQUATTED), (3, LOST)]

    def test_labels_from_the_config_win_over_the_readings(self):
        cards = (reading(0, label="slot A"), reading(1, label="slot B"), reading(2))
        statuses = fleet_status(self.snapshot(*cards), [], NOW, labels={1: "left"})
        assert [s.label for s in statuses] == ["slot A", "left", None]

    def test_users_in_first_seen_order_without_repeats(self):
        [status] = fleet_status(self.snapshot(reading(0, "bob", None, "alice", "bob", None)), [], NOW)
        assert status.users == ("bob", UNKNOWN_USER, "alice")

    def test_each_card_carries_the_host_it_is_on_and_since_when_that_host_is_down(self):
        assert {(s.host, s.down_since) for s in fleet_status(self.snapshot(), [], NOW)} == {("", None)}
        statuses = fleet_status(self.snapshot(), [], NOW, host="gpu2", down_since=NOW - 90.5)
        assert [(s.host, s.down_since) for s in statuses] == [("gpu2", NOW - 90.5)] * 3

"""On-demand bookings (the catalog's, [[models]]) through BookingService on a real store, the clock pinned: what an
on-demand booking is exempt from and what it keeps, `within`, and the lease. SQLite, then PostgreSQL (the `conn`
fixture's second store, marked `postgresql`).

The runner's account (board-llama) holds every on-demand booking. Project A (alice) may use online; [classes] gives
online to alice alone; a member holds one card at once, for an hour at most, a day ahead at most.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from msgspec.structs import replace

from app.config import ClassWindow, Config, Policy, Pool, Project, ProjectAllocation
from app.errors import BadInput, Conflict, NotPermitted
from app.store import events

H = 3600


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp())


NOW = utc("2026-12-07 08:00")  # a Monday
A = Project(name="A", members=("alice",), classes=("online", "batch", "experiment"))
B = Project(name="B", members=("bob",), classes=("experiment",),
            allocations=(ProjectAllocation(cards=(2, 3), hours="00:00-24:00"),))
POLICY = Policy(timezone="UTC", max_booking_hours=1, max_ahead_days=1, max_cards_per_user=1)
CONFIG = Config(projects=(A, B), policy=POLICY, classes={"online": ("alice",)})
USERS = {"alice": (1001, False), "bob": (1002, False), "carol": (1003, True), "board-llama": (990, False)}
TTL = 600


@pytest.fixture
def fleet(fleet):
    """Idle cool cards: what runs on them now is another file's subject."""
    return replace(fleet, cards=tuple(replace(c, processes=(), temperature_c=40) for c in fleet.cards))


@pytest.fixture
def as_(make_service):
    """as_("alice", now=NOW) -> BookingService for that user under CONFIG."""

    def make(user: str, now: int = NOW, config: Config = CONFIG):
        uid, admin = USERS[user]
        return make_service(user, uid, admin, config=config, now=now)

    return make


def on_demand(service, alias: str = "qwen", *, count: int = 2, end: int = NOW + TTL, project: str = "A", **how):
    """The booking model_demand makes: the runner's, for a catalog entry, from now."""
    return service.create(count=count, start=NOW, end=end, klass="online", project=project, on_demand=alias, **how)


# -- what it is exempt from, and what it keeps -------------------------------------------------------------------------


def test_an_on_demand_booking_is_exempt_from_the_rules_about_people(as_):
    """The runner's account is not in [classes] online nor in project A, holds 2 cards (the limit is 1) for 2 h (the
    longest is 1 h): all of it is the catalog's (the admin's) to say. Nearest wrong versions: any one exemption left
    out (the same booking without on_demand is refused by each rule)."""
    runner = as_("board-llama")
    booking = on_demand(runner, end=NOW + 2 * H)
    assert (booking.user, len(booking.cards), booking.end, booking.project) == ("board-llama", 2, NOW + 2 * H, "A")
    assert (booking.request, booking.note, booking.on_demand) == ({"on_demand": "qwen"}, "on demand: qwen", "qwen")
    for refused, how in ((NotPermitted, {}), (NotPermitted, {"klass": "batch"}),
                         (NotPermitted, {"klass": "batch", "count": 1, "project": "A"})):
        with pytest.raises(refused):
            as_("board-llama").create(**{"count": 2, "start": NOW, "end": NOW + 2 * H, "klass": "online",
                                         "project": "A", **how})
    # Far ahead too (a day at most for a member): its span grows by leases, and a preload may book ahead.
    assert on_demand(as_("board-llama"), "far", count=1, end=NOW + 30 * H).end == NOW + 30 * H


def test_it_merges_into_a_request_given_and_a_member_may_not_mark_a_request_on_demand(as_):
    """Nearest wrong versions: the request given dropped, on_demand taken from a member's request (a soft booking
    anyone can make)."""
    booking = on_demand(as_("board-llama"), request={"model": "/m/q.gguf", "ctx": 4096, "parallel": 1})
    assert booking.request == {"model": "/m/q.gguf", "ctx": 4096, "parallel": 1, "on_demand": "qwen"}
    with pytest.raises(BadInput, match="on_demand is the service's to set"):
        as_("alice").create(cards=[0], start=NOW, end=NOW + H, klass="online", request={"on_demand": "qwen"})


def test_it_keeps_the_pools_windows_other_projects_allocations_and_its_budget(as_):
    """Nearest wrong versions: card_refusal dropped with the cards-at-once limit (the window, the allocation let
    through), the budget exempted with the people's rules."""
    night = Pool(name="night", cards=(0, 1), windows={"online": ClassWindow(start_minute=19 * 60, end_minute=23 * 60)})
    windowed = Config(projects=(A, B), policy=POLICY, pools=(night,))
    with pytest.raises(NotPermitted, match="class online is allowed on pool night only 19:00-23:00"):
        on_demand(as_("board-llama", config=windowed), count=1, within=[0, 1])
    with pytest.raises(NotPermitted, match="the rules allow none: project B.s allocation"):
        on_demand(as_("board-llama"), count=1, within=[2, 3])
    budgeted = Config(projects=(replace(A, gpu_hours=1), B), policy=POLICY)
    with pytest.raises(NotPermitted, match="project A's budget is 1 GPU-hours"):
        on_demand(as_("board-llama", config=budgeted), end=NOW + H)  # 2 cards for an hour: 2 GPU-hours
    assert len(on_demand(as_("board-llama", config=budgeted), count=1, end=NOW + H).cards) == 1


# -- within ------------------------------------------------------------------------------------------------------------


def test_a_count_within_some_cards_takes_its_group_from_them_alone(as_):
    """Cards 4-7 (a pool's); alice holds 5. Nearest wrong versions: within ignored (the best-connected group of the
    whole box, 0-1), within read as the cards to leave out."""
    as_("alice").create(cards=[5], start=NOW, end=NOW + H, klass="online")
    assert on_demand(as_("board-llama"), within=[4, 5, 6, 7]).cards in ((4, 6), (4, 7), (6, 7))
    assert on_demand(as_("board-llama"), "other", count=1, within=[4, 5, 6, 7]).cards in ((4,), (6,), (7,))
    with pytest.raises(Conflict):
        on_demand(as_("board-llama"), "third", within=[4, 5, 6, 7])  # one of 4-7 left free
    assert on_demand(as_("board-llama"), "third", within=[0, 1]).cards == (0, 1)


# -- the lease ---------------------------------------------------------------------------------------------------------


def test_the_lease_moves_the_end_up_to_the_next_booking_less_ten_seconds_and_never_back(as_, conn):
    """alice books card 0 from 09:00; the on-demand booking holds cards 0-1 until 08:10. Nearest wrong versions: the cap
    at the next booking's start (no gap) or none at all, the end moved back by a lease that asks for less, a change
    under 5 s written, the lease audited."""
    runner = as_("board-llama")
    booking = on_demand(runner, within=[0, 1])
    alice_from = NOW + H
    as_("alice").create(cards=[0], start=alice_from, end=alice_from + H, klass="online")
    logged = events.tail(conn)
    assert runner.lease(booking.id, NOW + 1200).end == NOW + 1200
    assert runner.lease(booking.id, NOW + 600).end == NOW + 1200  # never earlier
    assert runner.lease(booking.id, NOW + 1204).end == NOW + 1200  # under 5 s: not written
    assert runner.lease(booking.id, NOW + 1205).end == NOW + 1205
    assert runner.lease(booking.id, NOW + 3 * H).end == alice_from - 10
    assert events.tail(conn) == logged
    with pytest.raises(BadInput, match="not on demand"):
        runner.lease(as_("alice").create(cards=[4], start=NOW, end=NOW + H, klass="online").id, NOW + H)
    # Ended: a lease does not bring it back.
    assert as_("board-llama", now=alice_from).lease(booking.id, alice_from + H).end == alice_from - 10

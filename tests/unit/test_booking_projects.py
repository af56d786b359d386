"""The booking side of projects through BookingService on a real SQLite file, the clock pinned: the classes a project
may use, its GPU-hour budget (the boundary, used vs booked ahead, the reset, an admin's --force), another project's
allocation (named cards and a count), and extend/move/reassign/series held to both.

Project A (alice, carol): online and batch, 100 GPU-hours a month, cards 4-7 on weekdays 09:00-19:00 (UTC).
Project B (bob, carol): experiment only, 20 GPU-hours a month. carol is an admin in both.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from app.config import Config, Policy, Project, ProjectAllocation
from app.errors import BadInput, Conflict, NotPermitted
from app.service.rules.series import SeriesService
from app.store import events
from tests.conftest import worded

H = 3600


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp())


NOW = utc("2026-12-07 08:00")  # a Monday; December's budget resets 2027-01-01 00:00 (in 25 days)
RESET = "2027-01-01 00:00 (in 25 days)"
A = Project(name="A", members=("alice", "carol"), classes=("online", "batch"), gpu_hours=100,
            allocations=(ProjectAllocation(cards=(4, 5, 6, 7), hours="09:00-19:00", days="mon-fri"),))
B = Project(name="B", members=("bob", "carol"), classes=("experiment",), gpu_hours=20)
CONFIG = Config(projects=(A, B), policy=Policy(timezone="UTC", max_booking_hours=72, max_ahead_days=30))
USERS = {"alice": (1001, False), "bob": (1002, False), "carol": (1003, True)}


@pytest.fixture
def fleet(fleet):
    """Idle cool cards: what runs on them now is another file's subject."""
    from msgspec.structs import replace

    return replace(fleet, cards=tuple(replace(c, processes=(), temperature_c=40) for c in fleet.cards))


@pytest.fixture
def as_(make_service):
    """as_("bob", now=NOW) -> BookingService for that user under CONFIG."""

    def make(user: str, now: int = NOW, config: Config = CONFIG):
        uid, admin = USERS[user]
        return make_service(user, uid, admin, config=config, now=now)

    return make


def written(conn) -> list:
    """Every booking, its cards and its project: what a refusal must leave as it was."""
    return [tuple(r) for r in conn.execute("SELECT * FROM bookings ORDER BY id")] + [
        tuple(r) for r in conn.execute("SELECT * FROM booking_cards ORDER BY booking_id, card_uuid")]


def refusal(error) -> str:
    message = worded(error.value)
    assert error.value.exit_code == 4 and "\n" not in message
    return message


# -- classes ----------------------------------------------------------------------------------------------------------


def test_a_member_of_a_project_without_the_class_is_refused_naming_the_class_and_who_may(as_, conn):
    """Nearest wrong versions: the project's classes never checked (B books online), the check made against the
    holder's [classes] alone."""
    for how in ({"cards": [0]}, {"count": 1}, {"count": 1, "or_later": True}):
        with pytest.raises(NotPermitted) as refused:
            as_("bob").create(**how, start=NOW, end=NOW + H, klass="online")
        assert refusal(refused) == "project B may not use class online (project A may); its classes are experiment"
    assert written(conn) == []
    assert as_("alice").create(cards=[0], start=NOW, end=NOW + H, klass="online").project == "A"


def test_a_member_of_two_must_pick_and_a_non_member_may_not_name_a_project(as_):
    """Nearest wrong versions: the first project taken for carol (her hours charged to A), bob let in to A."""
    with pytest.raises(BadInput, match=r"^carol is in projects A, B; pick one with --project$"):
        as_("carol").create(cards=[0], start=NOW, end=NOW + H)
    with pytest.raises(NotPermitted, match=r"^bob is not a member of project A \(members: alice, carol\); their"
                                           r" projects: B$"):
        as_("bob").create(cards=[0], start=NOW, end=NOW + H, klass="batch", project="A")
    assert as_("carol").create(cards=[0], start=NOW, end=NOW + H, project="B").project == "B"


# -- the budget -------------------------------------------------------------------------------------------------------


def test_the_twentieth_hour_is_accepted_and_the_twenty_first_refused_naming_budget_use_and_reset(as_, conn):
    """19 card-hours booked ahead (a 2-card booking of 4 h and 11 h on one card), then the 20th hour fits exactly and
    the 21st is refused. Nearest wrong versions: the boundary by one hour (`>=` for `>`, a booking that fills the
    budget exactly refused), the cards not multiplied in (a 2-card booking counted once), the reset a day off, the
    next start that works not the reset (a search that never tries it finds a booking's end instead)."""
    bob = as_("bob")
    bob.create(cards=[0, 1], start=NOW + H, end=NOW + 5 * H)  # 8 card-hours
    bob.create(cards=[2], start=NOW + 24 * H, end=NOW + 35 * H)  # 11
    twentieth = bob.create(cards=[3], start=NOW + 48 * H, end=NOW + 49 * H)
    before = written(conn)
    with pytest.raises(NotPermitted) as refused:
        bob.create(cards=[3], start=NOW + 49 * H, end=NOW + 50 * H)
    assert refusal(refused) == (
        "project B's budget is 20 GPU-hours a month: 0.0 h used and 20.0 h booked ahead, this booking needs 1.0 h;"
        f" it resets {RESET}; book less, or ask an admin; next free start for cards 3: {RESET}")
    assert written(conn) == before
    assert bob.get(twentieth.id).status == "booked"
    # A's budget is its own: alice books what B could not.
    assert as_("alice").create(cards=[3], start=NOW + 49 * H, end=NOW + 50 * H, klass="batch").project == "A"


def test_used_is_what_has_run_this_period_and_booked_is_what_is_ahead(as_):
    """A booking from 02:00 to 10:00 on 2 cards, seen at 08:00: 12 h used, 4 h booked ahead. Nearest wrong versions:
    used and booked swapped, a booking under way counted whole as used (or whole as ahead), last month's hours
    counted (a booking of November's last day)."""
    as_("bob", now=utc("2026-11-30 10:00")).create(cards=[3], start=utc("2026-11-30 10:00"),
                                                  end=utc("2026-12-01 02:00"))  # 14 h of November, 2 h of December
    as_("bob", now=utc("2026-12-07 02:00")).create(cards=[0, 1], start=utc("2026-12-07 02:00"),
                                                  end=utc("2026-12-07 10:00"))
    with pytest.raises(NotPermitted) as refused:
        as_("bob").create(cards=[2], start=NOW + 4 * H, end=NOW + 8 * H)
    assert refusal(refused).startswith(
        "project B's budget is 20 GPU-hours a month: 14.0 h used and 4.0 h booked ahead, this booking needs 4.0 h;"
        f" it resets {RESET}; book less, or ask an admin;")
    assert as_("bob").create(cards=[2], start=NOW + 4 * H, end=NOW + 6 * H).project == "B"  # 14 + 4 + 2 = 20


def test_a_booking_across_the_reset_is_held_to_each_periods_budget(as_):
    """18 h booked in December and 18 h in January; a booking from Dec 31 23:00 to Jan 1 03:00 needs 1 h of December
    (19: fits) and 3 h of January (21: refused, naming January's reset). Nearest wrong versions: all of it charged to
    the period it starts in (22 h of December), the next period never checked (the loop stops after one), the reset
    a day off (Jan 1's hours counted in December)."""
    bob = as_("bob", now=utc("2026-12-30 00:00"))
    bob.create(cards=[0], start=utc("2026-12-30 00:00"), end=utc("2026-12-30 18:00"))  # December: 18 h
    bob.create(cards=[1], start=utc("2027-01-01 03:00"), end=utc("2027-01-01 21:00"))  # January: 18 h
    with pytest.raises(NotPermitted) as refused:
        bob.create(cards=[2], start=utc("2026-12-31 23:00"), end=utc("2027-01-01 03:00"))
    assert refusal(refused).startswith("project B's budget is 20 GPU-hours a month: 0.0 h used and 18.0 h booked ahead,"
                                       " this booking needs 3.0 h; it resets 2027-02-01 00:00 (in 33 days);")
    assert bob.create(cards=[2], start=utc("2026-12-31 23:00"), end=utc("2027-01-01 01:00")).project == "B"  # 19, 19
    assert bob.create(cards=[3], start=utc("2026-12-31 22:00"), end=utc("2026-12-31 23:00")).project == "B"  # 20, 19
    assert bob.create(cards=[3], start=utc("2027-01-01 00:00"), end=utc("2027-01-01 01:00")).project == "B"  # 20, 20
    with pytest.raises(NotPermitted, match=r"^project B's budget .* 0\.0 h used and 20\.0 h booked ahead"):
        bob.create(cards=[4], start=utc("2026-12-31 21:00"), end=utc("2026-12-31 22:00"))


def test_over_the_budget_the_first_slot_offered_is_at_the_reset(as_):
    """`board book --asap` and the form's slots: the earliest start is the reset's midnight. Nearest wrong version:
    the reset not among the starts tried (the first offered is Jan 1 19:00, where A's allocation closes)."""
    bob = as_("bob")
    bob.create(cards=[0], start=NOW + H, end=NOW + 21 * H)
    [(slot, _), *_] = bob.options(1, "experiment", NOW + H, H)
    assert slot.start == utc("2027-01-01 00:00") and slot.project == "B"
    assert bob.create(count=1, start=NOW + H, end=NOW + 2 * H, or_later=True).start == utc("2027-01-01 00:00")


def test_a_queued_booking_moves_up_only_as_far_as_the_budget_allows(as_):
    """Over the budget, --asap waits at the reset; the backfill leaves it there while the month is full and moves
    it up once hours come back (to exactly the budget). Nearest wrong version: the queue's search skipping the
    budget (it moves into the full month at once)."""
    bob = as_("bob")
    full = bob.create(cards=[0], start=NOW + H, end=NOW + 21 * H)
    waiting = bob.create(count=1, start=NOW + H, end=NOW + 2 * H, or_later=True)
    assert (waiting.start, waiting.queued) == (utc("2027-01-01 00:00"), "cards")
    assert bob.backfill() == []
    bob.cancel(full.id)
    bob.create(cards=[0], start=NOW + 3 * H, end=NOW + 22 * H)  # 19 h: one left
    [(before, after)] = bob.backfill()
    assert (before.id, after.start, after.end) == (waiting.id, NOW + H, NOW + 2 * H)


def test_a_cancelled_booking_gives_its_hours_back(as_):
    bob = as_("bob")
    big = bob.create(cards=[0], start=NOW + H, end=NOW + 21 * H)
    with pytest.raises(NotPermitted, match="^project B's budget"):
        bob.create(cards=[1], start=NOW + H, end=NOW + 2 * H)
    bob.cancel(big.id)
    assert bob.create(cards=[1], start=NOW + H, end=NOW + 2 * H).project == "B"


def test_an_admins_force_passes_the_budget_and_is_audited_a_members_force_does_not(as_, conn):
    """Nearest wrong versions: the admin check dropped (bob's --force passes), the force not audited (the event says
    nothing of the budget it passed)."""
    as_("bob").create(cards=[0], start=NOW + H, end=NOW + 21 * H)
    before = written(conn)
    with pytest.raises(NotPermitted, match="^project B's budget is 20 GPU-hours a month: .* book less, or ask an admin;"):
        as_("bob").create(cards=[1], start=NOW + H, end=NOW + 2 * H, force=True)
    assert written(conn) == before
    booking, notes = as_("carol").book(cards=[1], start=NOW + H, end=NOW + 3 * H, force=True, project="B")
    assert booking.project == "B" and booking.user == "carol"
    said = ("past the budget by an admin: project B's budget is 20 GPU-hours a month: 0.0 h used and 20.0 h booked"
            f" ahead, this booking needs 2.0 h; it resets {RESET}")
    assert [worded(n) for n in notes] == [said]
    [event] = events.recent(conn, booking_id=booking.id)
    assert event.ok and event.details["force"] is True and worded(event.details["over_budget"]) == said


# -- the allocation ---------------------------------------------------------------------------------------------------


MONDAY_10 = utc("2026-12-07 10:00")


def test_another_projects_allocation_refuses_named_cards_and_a_count_picks_other_cards(as_, conn):
    """Nearest wrong versions: the allocation checked for named cards only (a count picks 4-7), the allocation's own
    project refused, the allocation's end inclusive (a booking from 19:00 refused)."""
    bob = as_("bob")
    with pytest.raises(NotPermitted) as refused:
        bob.create(cards=[4], start=MONDAY_10, end=MONDAY_10 + H)
    assert refusal(refused) == ("card 4: project A's allocation (mon-fri 09:00-19:00 UTC); pick other cards or a time"
                                " outside it; next free start for cards 4: 19:00 (in 11 h)")
    assert written(conn) == []
    made = bob.create(count=4, start=MONDAY_10, end=MONDAY_10 + H)
    assert made.cards == (0, 1, 2, 3)
    before = written(conn)
    with pytest.raises(Conflict) as taken:  # 0-3 taken: 4-7 are free but not his to take, now or later
        bob.create(count=4, start=MONDAY_10, end=MONDAY_10 + H)
    assert worded(taken.value) == (  # its id: on PostgreSQL the refused booking before it took one (with its locks)
        "no 4 cards are free for an experiment booking at 10:00 (in 2 h): cards 0,1,2,3 are booked by bob from 10:00"
        f" (in 2 h) to 11:00 (booking {made.id}); the earliest start that works: 11:00 (in 3 h) on cards 0,1,2,3 (--or-later"
        " takes it)")
    assert written(conn) == before
    assert bob.create(cards=[4], start=utc("2026-12-07 19:00"), end=utc("2026-12-07 20:00")).cards == (4,)
    assert bob.create(cards=[5], start=utc("2026-12-07 08:00"), end=utc("2026-12-07 09:00")).cards == (5,)
    assert bob.create(cards=[6], start=utc("2026-12-05 10:00") + 7 * 24 * H, end=utc("2026-12-05 11:00") + 7 * 24 * H
                      ).cards == (6,)  # a Saturday
    assert as_("alice").create(cards=[4, 5, 6, 7], start=MONDAY_10, end=MONDAY_10 + H, klass="online").cards == (
        4, 5, 6, 7)


def test_a_search_for_a_later_start_finds_the_allocations_end(as_):
    """--or-later for cards the allocation holds: the earliest start is where the window closes (19:00)."""
    booking = as_("bob").create(cards=[4], start=MONDAY_10, end=MONDAY_10 + H, or_later=True)
    assert (booking.start, booking.end) == (utc("2026-12-07 19:00"), utc("2026-12-07 20:00"))


# -- extend, move, reassign, series -----------------------------------------------------------------------------------


def test_extend_and_move_past_the_budget_or_into_the_allocation_are_refused(as_, conn):
    """Nearest wrong versions: the budget checked on create only (an extend takes B to 25 h), the booking's own
    hours counted twice (an extend within the budget refused), an admin's move or a member's extend skipping the
    allocation."""
    bob = as_("bob")
    first = bob.create(cards=[0], start=NOW + H, end=NOW + 11 * H)  # 10 h
    second = bob.create(cards=[4], start=utc("2026-12-07 19:00"), end=utc("2026-12-07 21:00"))  # 2 h, outside A's
    morning = bob.create(cards=[5], start=utc("2026-12-07 08:00"), end=utc("2026-12-07 09:00"))  # 1 h, before A's
    before = written(conn)
    with pytest.raises(NotPermitted, match=r"^project B's budget is 20 GPU-hours a month: 0\.0 h used and 3\.0 h"
                                           r" booked ahead, this booking needs 19\.0 h"):
        bob.extend(first.id, NOW + 20 * H)
    with pytest.raises(NotPermitted, match=r"^project B's budget .* this booking needs 21\.0 h"):
        as_("carol").move(first.id, NOW + H, NOW + 22 * H)
    with pytest.raises(NotPermitted, match=r"^card 4: project A's allocation \(mon-fri 09:00-19:00 UTC\)"):
        as_("carol").move(second.id, utc("2026-12-07 17:00"), utc("2026-12-07 19:00"))
    with pytest.raises(NotPermitted, match=r"^card 5: project A's allocation \(mon-fri 09:00-19:00 UTC\)"):
        bob.extend(morning.id, utc("2026-12-07 09:30"))  # into A's hours
    assert written(conn) == before
    assert bob.extend(first.id, NOW + 18 * H).end == NOW + 18 * H  # 17 + 2 + 1 = 20: the boundary
    moved = as_("carol").move(second.id, utc("2026-12-07 20:00"), utc("2026-12-07 22:00"), override_policy=False)
    assert moved.start == utc("2026-12-07 20:00")


def test_reassign_to_a_non_member_or_onto_allocated_cards_is_refused(as_, conn):
    """Nearest wrong versions: the new holder's membership never checked (bob's B hours given to alice, who is not in
    B), the new cards' allocation never checked."""
    booking = as_("bob").create(cards=[0], start=MONDAY_10, end=MONDAY_10 + H)
    before = written(conn)
    with pytest.raises(NotPermitted) as refused:
        as_("carol").reassign(booking.id, user="alice")
    assert refusal(refused) == (f"alice is not a member of project B, which booking {booking.id} is for; give it to a"
                                " member (bob, carol)")
    with pytest.raises(NotPermitted) as refused:
        as_("carol").reassign(booking.id, cards=[4])
    assert refusal(refused) == ("project A's allocation (mon-fri 09:00-19:00 UTC); pick other cards or a time outside"
                                " it")
    assert written(conn) == before
    given = as_("carol").reassign(booking.id, user="carol", cards=[1])
    assert (given.user, given.cards, given.project) == ("carol", (1,), "B")


def test_a_series_that_together_passes_the_budget_is_refused_whole_and_writes_nothing(as_, conn):
    """Eleven days of 2 h = 22 h, each occurrence alone well within 20. Nearest wrong versions: each occurrence
    checked alone (all eleven booked), the first ten booked and the rest dropped, the refusal naming one occurrence's
    2 h as what it needs, a member's --override-policy passing the budget."""
    rule = {"cards": [0], "every": "day", "start": "20:00", "until": "22:00", "first": "2026-12-08"}
    before = written(conn)
    with pytest.raises(NotPermitted) as refused:
        SeriesService(as_("bob")).book(**rule, last="2026-12-18")
    assert refusal(refused) == (
        "project B's budget is 20 GPU-hours a month: 0.0 h used and 0.0 h booked ahead, this series needs 22.0 h;"
        f" it resets {RESET}; book less, or ask an admin")
    assert written(conn) == before and conn.execute("SELECT count(*) FROM series").fetchone()[0] == 0
    with pytest.raises(NotPermitted, match="^only admins"):
        SeriesService(as_("bob")).book(**rule, last="2026-12-18", override_policy=True)
    outcome = SeriesService(as_("bob")).book(**rule, last="2026-12-17")  # ten: 20 h, the boundary
    assert len(outcome.booked) == 10 and {b.project for b in outcome.booked} == {"B"}
    with pytest.raises(NotPermitted) as refused:  # one occurrence alone past it: the policy's refusal of it
        SeriesService(as_("bob")).book(**{**rule, "cards": [1], "first": "2026-12-20"}, last="2026-12-20")
    assert refusal(refused) == (
        "the policy refuses the occurrence, so nothing was booked: project B's budget is 20 GPU-hours a month: 0.0 h"
        " used and 20.0 h booked ahead, this booking needs 2.0 h; it resets 2027-01-01 00:00 (in 25 days); book less,"
        " or ask an admin (Sun 2026-12-20 20:00); admins may pass --override-policy")


def test_an_admins_series_past_the_budget_with_override_policy_is_booked_and_audited(as_, conn):
    """carol (admin, in B) overrides the budget for a series: booked, and the series' event says by how much.
    Nearest wrong version: the override passing silently (the audit says only override_policy)."""
    outcome = SeriesService(as_("carol")).book(cards=[0], every="day", start="20:00", until="22:00",
                                               first="2026-12-08", last="2026-12-18", project="B",
                                               override_policy=True)
    assert len(outcome.booked) == 11
    [event] = [e for e in events.recent(conn) if e.action == "series"]
    assert worded(event.details["over_budget"]) == (
        "past the budget by an admin: project B's budget is 20 GPU-hours a month: 0.0 h used and 0.0 h booked"
        f" ahead, this series needs 22.0 h; it resets {RESET}")


def test_a_series_across_the_reset_counts_each_period_apart(as_):
    """Dec 27 to Jan 6, 2 h a day: 10 h in December, 12 h in January, both within 20. Nearest wrong version: the
    series summed as one period (22 h, refused)."""
    outcome = SeriesService(as_("bob", now=utc("2026-12-20 08:00"))).book(
        cards=[0], every="day", start="20:00", until="22:00", first="2026-12-27", last="2027-01-06")
    assert len(outcome.booked) == 11


def test_the_earliest_search_takes_only_a_project_its_holder_is_in(as_, conn):
    """A refusal's second half (the `earliest` operation) is asked by the client with the search the refusal carried;
    a member who names another project there would have the search treat that project's allocation as theirs and be
    told A's cards 4-7 are free at 09:00. Refused as a booking is, nothing written; their own project's search still
    answers. Wrong versions: the search's project taken as given; checked against the caller while searching for
    another holder."""
    before = written(conn)
    search = {"cards": [4], "class": "experiment", "start": utc("2026-12-07 09:00"), "duration": H}
    with pytest.raises(NotPermitted) as refused:
        as_("bob").earliest_words({**search, "project": "A"})
    assert refusal(refused).startswith("bob is not a member of project A")
    assert as_("bob").earliest_words({**search, "project": "B"}) == \
        f"next free start for cards 4: <@when:{utc('2026-12-07 19:00')}:{NOW}>"  # as the client words it: Mon 19:00
    assert written(conn) == before

"""app.core.projects: who books for which project (choose), the classes a project may use, its allocations' windows
(across midnight and DST, in a named zone) and its budget period; app.config's parse_hours/parse_days beside them.
Every instant is pinned: nothing here reads the clock."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from app.config import Config, Pool, Project, ProjectAllocation, parse_days, parse_hours
from app.core import projects
from app.errors import BadInput, NotPermitted
from app.model import Booking
from tests.unit.test_policy import me_and_my_group

BERLIN = ZoneInfo("Europe/Berlin")
UTC = ZoneInfo("UTC")
H = 3600


def at(text: str, tz=BERLIN) -> int:
    """Epoch seconds of a local wall-clock time, "2026-03-29 01:00"."""
    return int(datetime.fromisoformat(text).replace(tzinfo=tz).timestamp())


def two(**more) -> Config:
    return Config(projects=(Project(name="A", members=("alice", "carol"), classes=("online", "batch")),
                            Project(name="B", members=("bob", "carol"), classes=("experiment",))), **more)


# -- choose: which project a booking is for ---------------------------------------------------------------------------


def test_without_projects_everyone_books_for_the_implicit_one_and_naming_one_is_bad_input():
    """Nearest wrong versions: --project silently ignored on a board without projects (the booking looks as if it
    counted for something), or the implicit project refused as 'in no project'."""
    assert projects.choose(Config(), "alice", None) == projects.IMPLICIT == ""
    with pytest.raises(BadInput) as refused:
        projects.choose(Config(), "alice", "A")
    assert refused.value.exit_code == 2
    assert str(refused.value) == "this board has no projects, so there is no project 'A'; leave out --project"


def test_a_member_of_one_project_needs_nothing_and_may_name_it():
    config = Config(projects=(Project(name="A", members=("alice",)),))
    assert projects.choose(config, "alice", None) == "A"
    assert projects.choose(config, "alice", "A") == "A"


def test_a_member_of_several_must_pick_and_gets_the_one_picked():
    """Nearest wrong versions: the first project taken silently (the budget charged to the wrong one), or the pick
    ignored."""
    config = two()
    with pytest.raises(BadInput) as refused:
        projects.choose(config, "carol", None)
    assert refused.value.exit_code == 2 and str(refused.value) == "carol is in projects A, B; pick one with --project"
    assert projects.choose(config, "carol", "A") == "A" and projects.choose(config, "carol", "B") == "B"


def test_a_non_member_naming_a_project_is_refused_naming_its_members_and_theirs():
    """Nearest wrong versions: a non-member allowed (membership never checked once a name is given), or refused as
    bad input (exit 2) rather than by rule (exit 4)."""
    config = two()
    with pytest.raises(NotPermitted) as refused:
        projects.choose(config, "bob", "A")
    assert refused.value.exit_code == 4
    assert str(refused.value) == "bob is not a member of project A (members: alice, carol); their projects: B"
    with pytest.raises(NotPermitted, match="^mallory is in no project; ask an admin"):
        projects.choose(config, "mallory", None)
    with pytest.raises(NotPermitted, match=r"^mallory is not a member of project B .*ask an admin to add them"):
        projects.choose(config, "mallory", "B")


def test_an_unknown_project_is_bad_input_listing_the_projects_and_shown_inert():
    with pytest.raises(BadInput) as refused:
        projects.choose(two(), "alice", "C")
    assert str(refused.value) == "no project 'C'; the projects are A, B ('board projects' shows them)"
    with pytest.raises(BadInput) as refused:
        projects.choose(two(), "alice", "\x1b[2J" + "x" * 100)
    assert "\x1b" not in str(refused.value) and "'\\x1b[2J" + "x" * 36 + "'" in str(refused.value)


def test_membership_through_a_group_reads_the_real_group_database():
    """As [classes] does (tests/unit/test_policy.py): the account running the tests is in its own group. Nearest
    wrong versions: '@group' compared as a user name, a group without its '@' taken as a group."""
    me, group = me_and_my_group()
    config = Config(projects=(Project(name="ml", members=(f"@{group}",)), Project(name="other", members=("x",))))
    assert projects.choose(config, me, None) == "ml"
    assert projects.of(config, me) == (config.projects[0],)
    assert projects.of(config, "board-tests-no-such-user") == ()
    if group != me:  # root's group is root: the name would be the user's
        assert projects.of(Config(projects=(Project(name="ml", members=(group,)),)), me) == ()


def test_a_class_refusal_names_the_class_the_projects_that_may_and_the_projects_own():
    """Nearest wrong version: the check on the wrong side (a class the project has refused), or no one named."""
    config = two()
    assert projects.class_refusal(config, "A", "online") is None
    assert projects.class_refusal(config, "B", "online") == (
        "project B may not use class online (project A may); its classes are experiment")
    assert projects.class_refusal(config, "A", "finetune") == (
        "project A may not use class finetune (no project may); its classes are online, batch")
    both = Config(projects=(*two().projects, Project(name="C", members=("x",), classes=("online",))))
    assert projects.class_refusal(both, "B", "online") == (
        "project B may not use class online (projects A, C may); its classes are experiment")
    assert projects.class_refusal(Config(), projects.IMPLICIT, "online") is None  # no projects: every class


# -- parse_hours, parse_days ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, minutes", [("09:00-19:00", (540, 1140)), ("19:00-09:00", (1140, 540)),
                                           ("00:00-24:00", (0, 1440)), ("9:30 - 17:45", (570, 1065)),
                                           ("22:00-00:00", (1320, 0))])
def test_hours_are_minutes_of_the_day_and_may_wrap_midnight(text, minutes):
    assert parse_hours(text) == minutes


@pytest.mark.parametrize("text", ["09:00", "9-17", "25:00-09:00", "09:60-10:00", "24:01-09:00", "24:00-09:00",
                                  "\u0661\u0669:00-09:00", "09:00-19:00-20:00", "", "-", "09:0-10:00"])
def test_hours_that_are_no_hours_are_refused(text):
    """Nearest wrong versions: Arabic-Indic digits taken by int(), a minute of 60 or an hour past 24 taken, a window
    that opens at 24:00 (the next day's midnight, on a day the days do not name) taken."""
    with pytest.raises(ValueError):
        parse_hours(text)


@pytest.mark.parametrize("text, days", [("mon-fri", {0, 1, 2, 3, 4}), ("sat,sun", {5, 6}), ("fri-mon", {4, 5, 6, 0}),
                                        ("mon,wed-fri", {0, 2, 3, 4}), ("MON - Sun", set(range(7))),
                                        ("sun-sun", {6})])
def test_days_are_weekday_numbers_and_a_range_may_wrap_the_week(text, days):
    """Nearest wrong version: "fri-mon" read as an empty range (range(4, 1)), or as Monday to Friday."""
    assert parse_days(text) == frozenset(days)


@pytest.mark.parametrize("text", ["monday", "mon-", "", "mon,,tue", "mon-xyz", "mon;tue"])
def test_days_that_are_no_days_are_refused(text):
    with pytest.raises(ValueError):
        parse_days(text)


# -- allocations: their windows ---------------------------------------------------------------------------------------


def held(hours: str, days: str = "mon-sun", cards=(4, 5, 6, 7), pool: str | None = None, **more) -> Config:
    allocation = ProjectAllocation(cards=() if pool else tuple(cards), pool=pool, hours=hours, days=days)
    return Config(projects=(Project(name="A", members=("alice",), allocations=(allocation,)),
                            Project(name="B", members=("bob",))), **more)


def spans(config: Config, start: str, end: str, tz=BERLIN) -> list[tuple[str, str]]:
    return [(datetime.fromtimestamp(h.start, tz).isoformat(), datetime.fromtimestamp(h.end, tz).isoformat())
            for h in projects.allocation_spans(config, at(start, tz), at(end, tz), tz)]


def test_a_weekday_window_is_each_weekday_in_local_hours_and_the_weekend_has_none():
    # 2026-12-04 is a Friday: Friday's window, none on Saturday or Sunday, Monday's.
    assert spans(held("09:00-19:00", "mon-fri"), "2026-12-04 00:00", "2026-12-08 00:00") == [
        ("2026-12-04T09:00:00+01:00", "2026-12-04T19:00:00+01:00"),
        ("2026-12-07T09:00:00+01:00", "2026-12-07T19:00:00+01:00")]


def test_a_window_across_midnight_starts_on_its_day_and_one_open_at_the_start_is_found():
    """A Friday-night window (days "fri") runs into Saturday; asked from Saturday 03:00 it is still open. Nearest
    wrong versions: the search begins at the start's own midnight (the window opened the evening before is missed),
    the window's day taken as the day it ends."""
    config = held("22:00-06:00", "fri")
    assert spans(config, "2026-12-05 03:00", "2026-12-12 00:00") == [
        ("2026-12-04T22:00:00+01:00", "2026-12-05T06:00:00+01:00"),
        ("2026-12-11T22:00:00+01:00", "2026-12-12T06:00:00+01:00")]
    assert spans(config, "2026-12-05 06:00", "2026-12-11 22:00") == []  # half-open at both ends


def test_a_window_over_the_dst_nights_is_wall_clock_hours():
    """Europe/Berlin's last Sundays of March (2026-03-29, 02:00 -> 03:00) and October (2026-10-25, 03:00 -> 02:00):
    01:00-05:00 is 3 hours on the first and 5 on the second, and a window across midnight into them 7 and 9. Nearest
    wrong version: the end as the opening plus the window's length in seconds (4 h and 8 h, an hour off the clock)."""
    config = held("01:00-05:00", "sun")
    for day, hours in (("2026-03-29", 3), ("2026-10-25", 5), ("2026-03-22", 4)):
        [window] = projects.allocation_spans(config, at(f"{day} 00:00"), at(f"{day} 23:00"), BERLIN)
        assert (window.start, window.end) == (at(f"{day} 01:00"), at(f"{day} 05:00"))
        assert window.end - window.start == hours * H
    config = held("22:00-06:00", "sat")
    for day, after, hours in (("2026-03-28", "2026-03-29", 7), ("2026-10-24", "2026-10-25", 9)):
        [window] = projects.allocation_spans(config, at(f"{day} 12:00"), at(f"{after} 12:00"), BERLIN)
        assert (window.start, window.end, window.end - window.start) == (at(f"{day} 22:00"), at(f"{after} 06:00"),
                                                                         hours * H)


def test_a_pools_allocation_holds_the_pools_cards_and_the_end_is_exclusive():
    """Nearest wrong versions: the allocation's end inclusive (a booking starting at 19:00 refused), a booking ending
    at 09:00 refused, a pool's cards not resolved (nothing held)."""
    config = held("09:00-19:00", "mon-fri", pool="tp4", pools=(Pool(name="tp4", cards=(4, 5, 6, 7)),),
                  policy=two().policy)
    monday = "2026-12-07"
    [window] = projects.allocation_spans(config, at(f"{monday} 00:00"), at(f"{monday} 23:00"), BERLIN)
    assert window.cards == (4, 5, 6, 7) and window.project == "A"

    def refusal(project, cards, start, end):
        return projects.allocation_refusal(config, project, cards, at(f"{monday} {start}"), at(f"{monday} {end}"),
                                           BERLIN)

    assert refusal("B", (5,), "18:59", "20:00") == (
        "project A's allocation (mon-fri 09:00-19:00 Europe/Berlin); pick other cards or a time outside it")
    assert refusal("B", (3, 4, 5), "08:00", "09:01") == (
        "cards 4,5 are project A's allocation (mon-fri 09:00-19:00 Europe/Berlin); pick other cards or a time"
        " outside it")
    assert refusal("B", (5,), "19:00", "21:00") is None  # from the end on
    assert refusal("B", (5,), "07:00", "09:00") is None  # up to the start
    assert refusal("B", (0, 1, 2, 3), "10:00", "11:00") is None  # other cards
    assert refusal("A", (4, 5), "10:00", "11:00") is None  # its own
    assert projects.allocation_refusal(Config(), "", (4,), at(f"{monday} 10:00"), at(f"{monday} 11:00"),
                                       BERLIN) is None


def test_where_allocations_close_are_the_starts_a_search_tries():
    config = held("09:00-19:00", "mon-fri")
    assert projects.allocation_opens(config, at("2026-12-04 10:00"), at("2026-12-08 10:00"), BERLIN) == [
        at("2026-12-04 19:00"), at("2026-12-07 19:00")]


# -- the budget's period ----------------------------------------------------------------------------------------------


def period(kind: str, now: str, tz=BERLIN) -> tuple[str, str]:
    project = Project(name="A", members=("alice",), period=kind)
    first, reset = projects.period(project, at(now, tz), tz)
    return datetime.fromtimestamp(first, tz).isoformat(), datetime.fromtimestamp(reset, tz).isoformat()


@pytest.mark.parametrize("kind, now, expected", [
    ("month", "2026-12-05 20:26", ("2026-12-01T00:00:00+01:00", "2027-01-01T00:00:00+01:00")),  # Dec -> Jan
    ("month", "2026-12-31 23:59", ("2026-12-01T00:00:00+01:00", "2027-01-01T00:00:00+01:00")),
    ("month", "2027-01-01 00:00", ("2027-01-01T00:00:00+01:00", "2027-02-01T00:00:00+01:00")),  # the reset: the next
    ("month", "2028-02-10 12:00", ("2028-02-01T00:00:00+01:00", "2028-03-01T00:00:00+01:00")),  # a leap year's Feb
    ("month", "2027-02-28 23:00", ("2027-02-01T00:00:00+01:00", "2027-03-01T00:00:00+01:00")),
    ("month", "2026-03-31 12:00", ("2026-03-01T00:00:00+01:00", "2026-04-01T00:00:00+02:00")),  # across DST
    ("week", "2026-12-05 20:26", ("2026-11-30T00:00:00+01:00", "2026-12-07T00:00:00+01:00")),  # a Saturday
    ("week", "2026-12-07 00:00", ("2026-12-07T00:00:00+01:00", "2026-12-14T00:00:00+01:00")),  # Monday's midnight
    ("week", "2026-12-06 23:59", ("2026-11-30T00:00:00+01:00", "2026-12-07T00:00:00+01:00")),  # Sunday's last minute
    ("week", "2026-12-31 12:00", ("2026-12-28T00:00:00+01:00", "2027-01-04T00:00:00+01:00")),  # across the year
    ("week", "2026-03-29 12:00", ("2026-03-23T00:00:00+01:00", "2026-03-30T00:00:00+02:00")),  # the DST week
])
def test_a_period_runs_from_local_midnight_to_local_midnight(kind, now, expected):
    """Nearest wrong versions: the reset a day off (the last day of the period, or a month of 30 days), a week from
    Sunday, the month's reset computed in UTC (an hour off in Berlin), the reset instant still in the old period."""
    assert period(kind, now) == expected


def test_a_period_is_the_zones_not_utcs():
    """Just after midnight on the 1st in Berlin it is still the last day of the month in UTC."""
    assert period("month", "2027-01-01 00:30") == ("2027-01-01T00:00:00+01:00", "2027-02-01T00:00:00+01:00")
    first, reset = projects.period(Project(name="A", members=("a",)), at("2027-01-01 00:30"), UTC)
    assert (first, reset) == (at("2026-12-01 00:00", UTC), at("2027-01-01 00:00", UTC))


# -- card_seconds: what the calendar holds ----------------------------------------------------------------------------


def booking(id: int, start: int, end: int, cards=(0,), status="booked") -> Booking:
    return Booking(id=id, user="alice", uid=1001, cards=tuple(cards), card_uuids=tuple(f"GPU-{c}" for c in cards),
                   start=start, end=end, klass="experiment", note="", status=status, project="A")


def test_card_seconds_counts_booked_cards_times_hours_clipped_to_the_span_and_leaves_out_cancelled():
    """Nearest wrong versions: a cancelled booking counted, a booking counted whole past the span's ends, its cards
    not multiplied in."""
    start, end = 10 * H, 20 * H
    found = [booking(1, 8 * H, 12 * H, cards=(0, 1)),  # 2 h inside, on 2 cards
             booking(2, 11 * H, 13 * H),  # 2 h
             booking(3, 19 * H, 25 * H, cards=(0, 1, 2, 3)),  # 1 h inside, on 4 cards
             booking(4, 12 * H, 18 * H, cards=(5, 6), status="cancelled"),
             booking(5, 20 * H, 22 * H),  # after: the end is exclusive
             booking(6, 2 * H, 10 * H)]  # before
    assert projects.card_seconds(found, start, end) == (2 * 2 + 2 + 4) * H
    assert projects.card_seconds([], start, end) == 0

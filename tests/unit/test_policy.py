from datetime import datetime, timezone

import pytest

from app.config import ClassWindow, Config, Policy, Pool
from app.core import policy
from app.errors import NotPermitted

# The window check walks the booking day by day: a step that stops advancing must fail the test, not hang it.
pytestmark = pytest.mark.timeout(120)

UTC = timezone.utc
PROD = Pool("prod", (0, 1, 2, 3), ("online", "batch", "finetune"), windows={"finetune": ClassWindow(19 * 60, 9 * 60)})
LAB = Pool("lab", (4, 5, 6, 7), max_hours=12)
CONFIG = Config(policy=Policy(max_booking_hours=48, max_ahead_days=7, max_cards_per_user=4), pools=(PROD, LAB))


def at(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


@pytest.mark.parametrize(
    "card, klass, start, end, refused",
    [
        (0, "online", "2026-12-01T10:00", "2026-12-01T12:00", None),
        (0, "experiment", "2026-12-01T10:00", "2026-12-01T12:00", "not allowed on pool prod"),
        (0, "finetune", "2026-12-01T10:00", "2026-12-01T12:00", "only 19:00-09:00 (UTC) and at weekends"),  # Tuesday day
        (0, "finetune", "2026-12-01T19:00", "2026-12-02T09:00", None),  # the whole night window
        (0, "finetune", "2026-12-01T18:00", "2026-12-01T20:00", "only 19:00"),  # starts an hour early
        (0, "finetune", "2026-12-01T20:00", "2026-12-02T10:00", "only 19:00"),  # runs an hour late
        (0, "finetune", "2026-12-05T10:00", "2026-12-05T16:00", None),  # Saturday
        (0, "finetune", "2026-12-04T20:00", "2026-12-07T09:00", None),  # Friday night to Monday morning
        (0, "finetune", "2026-12-04T20:00", "2026-12-07T10:00", "only 19:00"),  # into Monday working hours
        (5, "finetune", "2026-12-01T10:00", "2026-12-01T12:00", None),  # lab takes anything
        (5, "experiment", "2026-12-01T00:00", "2026-12-01T13:00", "at most 12 h"),
    ],
)
def test_card_refusal(card, klass, start, end, refused):
    reason = policy.card_refusal(CONFIG, card, klass, at(start), at(end), tz=UTC)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


def check(**overrides):
    args = dict(cards=(4,), klass="experiment", start=at("2026-12-01T10:00"), end=at("2026-12-01T12:00"),
                now=at("2026-12-01T09:00"), held=(), tz=UTC)
    args.update(overrides)
    policy.check(CONFIG, **args)


def test_check_accepts_a_plain_booking():
    check()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"end": at("2026-12-03T11:00"), "cards": (4,), "klass": "experiment"}, "at most 48 h"),
        ({"start": at("2026-12-09T10:00"), "end": at("2026-12-09T11:00")}, "at most 7 days ahead"),
        ({"cards": (4, 5), "held": [(at("2026-12-01T11:00"), at("2026-12-01T14:00"), 3)]}, "hold 5 cards at once"),
    ],
)
def test_check_refuses_with_the_rule(overrides, message):
    with pytest.raises(NotPermitted, match=message):
        check(**overrides)


def test_cards_held_at_different_times_do_not_add_up():
    # Both held bookings overlap the new one (10-12) and meet each other at 11:00: 3 then 3, never 6 at once.
    held = [(at("2026-12-01T09:00"), at("2026-12-01T11:00"), 3), (at("2026-12-01T11:00"), at("2026-12-01T13:00"), 3)]
    check(cards=(4,), held=held)  # 3 + 1 = 4 at any moment: exactly the limit
    with pytest.raises(NotPermitted, match="hold 5 cards at once"):
        check(cards=(4, 5), held=held)
    with pytest.raises(NotPermitted, match="hold 7 cards at once"):  # a third held booking inside both
        check(cards=(4,), held=held + [(at("2026-12-01T10:30"), at("2026-12-01T11:30"), 3)])


@pytest.mark.parametrize("held_start, held_end", [
    ("2026-12-01T08:00", "2026-12-01T10:00"),  # ends as the new one starts
    ("2026-12-01T12:00", "2026-12-01T14:00"),  # starts as the new one ends
])
def test_a_booking_that_only_meets_the_new_one_is_not_held_at_once(held_start, held_end):
    check(cards=(4,), held=[(at(held_start), at(held_end), 4)])  # 4 + 1 would be over the limit of 4


def test_a_booking_that_overlaps_by_one_second_is_held_at_once():
    before = (at("2026-12-01T08:00"), at("2026-12-01T10:00") + 1, 4)
    after = (at("2026-12-01T12:00") - 1, at("2026-12-01T14:00"), 4)
    for held in (before, after):
        with pytest.raises(NotPermitted, match="hold 5 cards at once; the limit is 4"):
            check(cards=(4,), held=[held])


# -- each limit exactly at the boundary (allowed) and one second past it (refused) ---------------------------


def test_the_longest_booking_exactly_is_allowed_and_a_second_more_is_not():
    start, prod = at("2026-12-01T10:00"), {"cards": (0,), "klass": "online"}  # prod has no cap of its own
    check(start=start, end=start + 48 * 3600, **prod)
    with pytest.raises(NotPermitted, match="at most 48 h"):
        check(start=start, end=start + 48 * 3600 + 1, **prod)


def test_the_furthest_start_exactly_is_allowed_and_a_second_later_is_not():
    now = at("2026-12-01T09:00")
    check(now=now, start=now + 7 * 86400, end=now + 7 * 86400 + 3600)
    with pytest.raises(NotPermitted, match="at most 7 days ahead"):
        check(now=now, start=now + 7 * 86400 + 1, end=now + 7 * 86400 + 3601)


def test_the_card_limit_exactly_is_allowed_and_one_more_card_is_not():
    check(cards=(4, 5, 6, 7))
    check(cards=(4,), held=[(at("2026-12-01T10:00"), at("2026-12-01T12:00"), 3)])
    with pytest.raises(NotPermitted, match="hold 5 cards at once; the limit is 4"):
        check(cards=(4, 5), held=[(at("2026-12-01T10:00"), at("2026-12-01T12:00"), 3)])


def test_the_pool_cap_exactly_is_allowed_and_a_second_more_is_not():
    start = at("2026-12-01T00:00")
    assert policy.card_refusal(CONFIG, 5, "experiment", start, start + 12 * 3600, tz=UTC) is None
    assert "pool lab allows at most 12 h" in policy.card_refusal(CONFIG, 5, "experiment", start, start + 12 * 3600 + 1,
                                                                 tz=UTC)
    check(cards=(5,), start=start, end=start + 12 * 3600, now=start)
    with pytest.raises(NotPermitted, match="card 5: pool lab allows at most 12 h"):
        check(cards=(5,), start=start, end=start + 12 * 3600 + 1, now=start)


def test_a_card_in_no_pool_takes_any_class():
    alone = Config(policy=CONFIG.policy, pools=(LAB,))
    assert policy.card_refusal(alone, 0, "finetune", at("2026-12-01T10:00"), at("2026-12-01T12:00"), tz=UTC) is None


DAY = Pool("day", (0,), windows={"batch": ClassWindow(9 * 60, 19 * 60, weekends=False)})
DAY_CONFIG = Config(policy=CONFIG.policy, pools=(DAY,))


@pytest.mark.parametrize(
    "start, end, allowed",
    [
        ("2026-12-01T09:00", "2026-12-01T19:00", True),  # exactly the window (Tuesday)
        ("2026-12-01T08:59", "2026-12-01T12:00", False),  # a minute early
        ("2026-12-01T12:00", "2026-12-01T19:01", False),  # a minute late
        ("2026-12-01T18:00", "2026-12-01T19:00", True),  # ends exactly at the window's end
        ("2026-12-01T19:00", "2026-12-01T20:00", False),  # starts exactly at the window's end
        ("2026-12-01T09:00", "2026-12-02T19:00", False),  # two working days, but the night between is outside
        ("2026-12-01T20:00", "2026-12-01T22:00", False),  # evening
        ("2026-12-01T03:00", "2026-12-01T04:00", False),  # small hours: outside a window that does not wrap
        ("2026-12-05T10:00", "2026-12-05T12:00", True),  # Saturday, inside the hours: weekends are no exception here
        ("2026-12-05T20:00", "2026-12-05T21:00", False),  # Saturday evening, no weekend allowance
        ("2026-12-01T09:30", "2026-12-01T18:30", True),  # inside, starting off the hour
        ("2026-12-01T18:30", "2026-12-01T19:15", False),  # off the hour, into the evening
        ("2026-12-01T18:00:30", "2026-12-01T19:00:15", False),  # off the minute, 15 s into the evening
        ("2026-12-01T18:00", "2026-12-01T19:00:01", False),  # one second into the evening
    ],
)
def test_a_window_within_one_day(start, end, allowed):
    reason = policy.card_refusal(DAY_CONFIG, 0, "batch", at(start), at(end), tz=UTC)
    if allowed:
        assert reason is None
    else:
        assert reason is not None and "only 09:00-19:00" in reason and "weekends" not in reason


@pytest.mark.parametrize(
    "start, end, allowed",
    [
        ("2026-12-01T19:00", "2026-12-01T23:59", True),  # starts exactly at the window's start
        ("2026-12-01T18:59", "2026-12-01T20:00", False),
        ("2026-12-02T00:00", "2026-12-02T09:00", True),  # after midnight, ends exactly at the window's end
        ("2026-12-02T08:00", "2026-12-02T09:01", False),
        ("2026-12-02T09:00", "2026-12-02T10:00", False),  # starts exactly at the window's end
        ("2026-12-01T19:00", "2026-12-03T09:00", False),  # two nights: the day between is outside
        ("2026-12-04T19:00", "2026-12-07T09:00", True),  # Friday night, the weekend, Monday morning
        ("2026-12-06T10:00", "2026-12-07T10:00", False),  # Sunday into Monday's working hours
    ],
)
def test_a_window_that_wraps_midnight(start, end, allowed):
    reason = policy.card_refusal(CONFIG, 0, "finetune", at(start), at(end), tz=UTC)
    assert (reason is None) is allowed, reason


def test_windows_are_read_in_the_configured_zone_whatever_the_process_zone():
    from msgspec.structs import replace

    # 20:00-23:00 UTC is 04:00-07:00 the next morning in Shanghai: inside the night window there, not in UTC.
    start, end = at("2026-12-01T20:00"), at("2026-12-01T23:00")
    shanghai = replace(CONFIG, policy=replace(CONFIG.policy, timezone="Asia/Shanghai"))
    berlin = replace(CONFIG, policy=replace(CONFIG.policy, timezone="Europe/Berlin"))  # 21:00-24:00 there: inside too
    early = at("2026-12-01T10:30"), at("2026-12-01T11:30")  # 18:30 in Shanghai: outside; 11:30 in Berlin: outside
    assert policy.card_refusal(shanghai, 0, "finetune", start, end) is None
    assert policy.card_refusal(berlin, 0, "finetune", start, end) is None
    # The hours are the policy zone's, and say so: a member elsewhere reads them as that zone's.
    assert "only 19:00-09:00 (Asia/Shanghai)" in policy.card_refusal(shanghai, 0, "finetune", *early)
    assert "only 19:00-09:00 (Europe/Berlin)" in policy.card_refusal(berlin, 0, "finetune", *early)
    assert policy.card_refusal(shanghai, 0, "finetune", at("2026-12-01T11:00"), at("2026-12-01T12:00")) is None  # 19-20h


def test_a_refusal_names_the_pool_its_cards_and_the_window_exactly():
    day = policy.card_refusal(DAY_CONFIG, 0, "batch", at("2026-12-01T20:00"), at("2026-12-01T21:00"), tz=UTC)
    assert day == "class batch is allowed on pool day only 09:00-19:00 (UTC)"
    night = policy.card_refusal(CONFIG, 0, "finetune", at("2026-12-01T10:00"), at("2026-12-01T11:00"), tz=UTC)
    assert night == "class finetune is allowed on pool prod only 19:00-09:00 (UTC) and at weekends"
    other = policy.card_refusal(CONFIG, 1, "experiment", at("2026-12-01T10:00"), at("2026-12-01T11:00"), tz=UTC)
    assert other == "class experiment is not allowed on pool prod (cards 0,1,2,3)"


def test_check_reads_windows_in_the_zone_it_is_given():
    from zoneinfo import ZoneInfo

    # 11:00-12:00 UTC is 19:00-20:00 in Shanghai: inside the night window there, not in UTC.
    night_there = dict(cards=(0,), klass="finetune", start=at("2026-12-01T11:00"), end=at("2026-12-01T12:00"))
    check(tz=ZoneInfo("Asia/Shanghai"), **night_there)
    with pytest.raises(NotPermitted, match="card 0: class finetune is allowed on pool prod only 19:00-09:00"):
        check(tz=UTC, **night_there)


def test_a_window_that_starts_and_ends_at_the_same_minute_is_empty():
    # The config accepts "10:00-10:00"; it allows nothing (but weekends, when it has them), never the whole day.
    empty = Config(policy=CONFIG.policy, pools=(Pool("p", (0,), windows={"batch": ClassWindow(600, 600, False)}),))
    for start, end in (("2026-12-01T10:00", "2026-12-01T11:00"), ("2026-12-01T09:00", "2026-12-01T10:00"),
                       ("2026-12-01T22:00", "2026-12-01T23:00")):
        assert policy.card_refusal(empty, 0, "batch", at(start), at(end), tz=UTC) == (
            "class batch is allowed on pool p only 10:00-10:00 (UTC)")


def test_a_booking_inside_the_hour_the_clocks_go_back_is_still_checked():
    # Berlin, Sunday 2026-10-25: 02:30 summer time to 02:15 winter time is 45 minutes, all outside 09:00-19:00.
    berlin = Config(policy=Policy(timezone="Europe/Berlin"), pools=DAY_CONFIG.pools)
    reason = policy.card_refusal(berlin, 0, "batch", at("2026-10-25T00:30"), at("2026-10-25T01:15"))
    assert reason == "class batch is allowed on pool day only 09:00-19:00 (Europe/Berlin)"
    assert policy.card_refusal(berlin, 0, "batch", at("2026-10-25T08:00"), at("2026-10-25T09:00")) is None  # 9-10


def test_the_system_zone_keeps_its_rules_across_a_clock_change(monkeypatch):
    import time

    # No [policy] timezone: the system's. Friday 20:00 summer time to Monday 09:00 winter time, Berlin.
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        weekend = policy.card_refusal(CONFIG, 0, "finetune", at("2026-10-23T18:00"), at("2026-10-26T08:00"))
        late = policy.card_refusal(CONFIG, 0, "finetune", at("2026-10-23T18:00"), at("2026-10-26T08:01"))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert weekend is None
    assert late == "class finetune is allowed on pool prod only 19:00-09:00 (Europe/Berlin) and at weekends"


# -- who may use a class ([classes]) ---------------------------------------------------------------------------------


def me_and_my_group() -> tuple[str, str]:
    """The account running the tests and the name of its own group: a real pair in the system's group database."""
    import grp
    import os
    import pwd

    entry = pwd.getpwuid(os.getuid())
    return entry.pw_name, grp.getgrgid(entry.pw_gid).gr_name


def test_a_class_is_for_the_names_and_groups_listed_and_an_unlisted_class_for_everyone():
    me, group = me_and_my_group()
    config = Config(classes={"online": (f"@{group}",), "batch": ("someone-else",), "finetune": (me,),
                             "experiment": ()})
    assert policy.may_use(config, "online", me)  # by a group of theirs
    assert not policy.may_use(config, "online", "board-tests-no-such-user")  # no account: in no group
    assert not policy.may_use(config, "batch", me)  # another name listed
    assert policy.may_use(config, "finetune", me)  # by name
    assert not policy.may_use(config, "experiment", me)  # an empty list: nobody
    if group != me:  # root's group is root: the name would be the user's
        assert not policy.may_use(Config(classes={"online": (group,)}), "online", me)  # a group needs its '@'
    assert not policy.may_use(Config(classes={"online": (f"@{me}x",)}), "online", me)
    assert policy.may_use(Config(classes={"batch": ()}), "online", me)  # the opposite default: unlisted, everyone


def test_a_class_refusal_names_the_class_who_may_and_what_is_left():
    config = Config(classes={"online": ("@serving", "alice"), "finetune": ()})
    assert policy.class_refusal(config, "online", "alice") is None
    assert policy.class_refusal(config, "online", "board-tests-bob") == (
        "board-tests-bob may not use class online: it is for @serving, alice ([classes] in the service's config);"
        " use batch or experiment")
    assert policy.class_refusal(config, "finetune", "alice") == (
        "alice may not use class finetune: it is for no one ([classes] in the service's config); use online or batch"
        " or experiment")
    closed = Config(classes={k: ("alice",) for k in ("online", "batch", "finetune", "experiment")})
    assert policy.class_refusal(closed, "batch", "board-tests-bob").endswith(
        "; no class is open to them; ask an admin")

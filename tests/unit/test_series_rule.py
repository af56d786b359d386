"""The pure expansion of a standing slot (app.core.series): which days, what times, across DST and midnight."""

from __future__ import annotations

import time
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from app.core.series import (
    MAX_SPAN_DAYS, Rule, describe, local_date, make_rule, occurrences, parse_clock, parse_date, parse_every,
)
from app.errors import BadInput

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
MONDAY = date(2026, 12, 7)


def days_of(rule: Rule, tz=UTC) -> list[str]:
    return [datetime.fromtimestamp(start, tz).strftime("%a %d") for start, _ in occurrences(rule, tz)]


def walls(rule: Rule, tz) -> list[tuple[str, str]]:
    return [(datetime.fromtimestamp(s, tz).strftime("%a %d %H:%M"), datetime.fromtimestamp(e, tz).strftime("%a %d %H:%M"))
            for s, e in occurrences(rule, tz)]


@pytest.mark.parametrize(
    "every, expected",
    [
        ("day", ["Mon 07", "Tue 08", "Wed 09", "Thu 10", "Fri 11", "Sat 12", "Sun 13", "Mon 14"]),
        ("weekday", ["Mon 07", "Tue 08", "Wed 09", "Thu 10", "Fri 11", "Mon 14"]),
        ("weekend", ["Sat 12", "Sun 13"]),
        ("mon,wed,fri", ["Mon 07", "Wed 09", "Fri 11", "Mon 14"]),
        ("Friday, MON", ["Mon 07", "Fri 11", "Mon 14"]),  # full names, any case, any order
        ("tue", ["Tue 08"]),
    ],
)
def test_every_picks_the_days_from_the_first_to_the_last_inclusive(every, expected):
    rule = make_rule(every, "9:00", "19:00", MONDAY, MONDAY + timedelta(days=7))
    assert days_of(rule) == expected


def test_week_repeats_on_the_weekday_of_the_first_day():
    wednesday = date(2026, 12, 9)
    rule = make_rule("week", "9", "10", wednesday, wednesday + timedelta(days=21))
    assert rule.days == (2,)
    assert days_of(rule) == ["Wed 09", "Wed 16", "Wed 23", "Wed 30"]
    assert describe(rule.to_json()) == "every week (Wednesday) 09:00-10:00, 2026-12-09 to 2026-12-30"


def test_each_occurrence_runs_from_start_to_until_on_its_day():
    rule = make_rule("weekday", "9:00", "19:00", MONDAY, MONDAY + timedelta(days=1))
    assert walls(rule, UTC) == [("Mon 07 09:00", "Mon 07 19:00"), ("Tue 08 09:00", "Tue 08 19:00")]


def test_an_until_at_or_before_the_start_ends_the_next_morning():
    rule = make_rule("weekday", "19:00", "07:00", MONDAY + timedelta(days=4), MONDAY + timedelta(days=7))
    assert walls(rule, UTC) == [("Fri 11 19:00", "Sat 12 07:00"), ("Mon 14 19:00", "Tue 15 07:00")]
    assert rule.overnight and describe(rule.to_json()).startswith("every weekday 19:00-07:00 (next day)")
    midnight = make_rule("day", "22:00", "24:00", MONDAY, MONDAY)
    assert walls(midnight, UTC) == [("Mon 07 22:00", "Tue 08 00:00")]


def test_clock_times_stay_on_the_wall_clock_across_dst():
    # Europe/Berlin springs forward on Sunday 2027-03-28 and falls back on Sunday 2027-10-31.
    spring = make_rule("day", "9:00", "19:00", date(2027, 3, 27), date(2027, 3, 29))
    assert [w[0][-5:] for w in walls(spring, BERLIN)] == ["09:00"] * 3
    assert [datetime.fromtimestamp(s, UTC).hour for s, _ in occurrences(spring, BERLIN)] == [8, 7, 7]
    night = make_rule("day", "19:00", "7:00", date(2027, 3, 27), date(2027, 3, 27))
    (start, end), = occurrences(night, BERLIN)
    assert end - start == 11 * 3600  # the night the clocks skip an hour
    autumn = make_rule("day", "19:00", "7:00", date(2027, 10, 30), date(2027, 10, 30))
    (start, end), = occurrences(autumn, BERLIN)
    assert end - start == 13 * 3600 and walls(autumn, BERLIN) == [("Sat 30 19:00", "Sun 31 07:00")]


def test_a_time_the_clocks_skip_moves_forward_by_the_gap():
    rule = make_rule("day", "2:30", "5:00", date(2027, 3, 28), date(2027, 3, 28))
    assert walls(rule, BERLIN) == [("Sun 28 03:30", "Sun 28 05:00")]


def test_no_zone_means_the_process_local_time_with_its_own_rules(monkeypatch):
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        rule = make_rule("day", "9:00", "19:00", date(2027, 3, 27), date(2027, 3, 29))
        assert occurrences(rule, None) == occurrences(rule, BERLIN)
    finally:
        monkeypatch.undo()
        time.tzset()


def test_the_rule_round_trips_through_its_json():
    rule = make_rule("mon,fri", "19:00", "7:00", MONDAY, MONDAY + timedelta(days=30))
    assert Rule.from_json(rule.to_json()) == rule
    assert rule.to_json() == {"every": "mon,fri", "days": [0, 4], "start": "19:00", "until": "07:00",
                              "from": "2026-12-07", "to": "2027-01-06"}
    with pytest.raises(ValueError):
        Rule.from_json({**rule.to_json(), "days": [7]})


@pytest.mark.parametrize(
    "every, start, until, first, last, message",
    [
        ("fortnight", "9", "19", MONDAY, MONDAY, "can't read --every 'fortnight'; use day, weekday"),
        ("mo", "9", "19", MONDAY, MONDAY, "can't read --every 'mo'"),
        ("mon,,fri", "9", "19", MONDAY, MONDAY, "can't read --every"),
        ("day", "tomorrow 9:00", "19", MONDAY, MONDAY, "can't read --start 'tomorrow 9:00' as a time of day"),
        ("day", "9", "25:00", MONDAY, MONDAY, "can't read --until '25:00'"),
        ("day", "9", "9:00", MONDAY, MONDAY, "--until 09:00 is the same time as --start"),
        ("day", "9", "19", MONDAY, MONDAY - timedelta(days=1), "--to 2026-12-06 is before --from 2026-12-07"),
        ("day", "9", "19", MONDAY, MONDAY + timedelta(days=MAX_SPAN_DAYS + 1), "a series spans at most 366 days"),
    ],
)
def test_bad_rules_are_one_line_bad_input(every, start, until, first, last, message):
    with pytest.raises(BadInput) as refused:
        make_rule(every, start, until, first, last)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_rule_may_have_no_occurrences_the_service_refuses_that():
    rule = make_rule("weekend", "9", "19", MONDAY, MONDAY + timedelta(days=4))
    assert occurrences(rule, UTC) == []


@pytest.mark.parametrize("text, minute", [("9", 540), ("09:00", 540), ("19:30", 1170), ("0:00", 0), ("24:00", 0)])
def test_clock_times(text, minute):
    assert parse_clock(text, "--start") == minute


def test_every_words_are_stored_as_people_read_them():
    assert parse_every("Weekdays", MONDAY) == ("weekday", (0, 1, 2, 3, 4))
    assert parse_every("wed,mon,wed", MONDAY) == ("mon,wed", (0, 2))
    assert parse_every("daily", MONDAY) == ("day", tuple(range(7)))


CLOCK_HINT = "with --every, give clock times such as --start 9:00 --until 19:00"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"days": [7]}, "days (7,) are not weekdays 0-6"),
        ({"start": "9h"}, f"can't read start '9h' as a time of day; {CLOCK_HINT}"),
        ({"until": "7pm"}, f"can't read until '7pm' as a time of day; {CLOCK_HINT}"),
        ({"from": "12/07/2026"}, "can't read from '12/07/2026' as a date; give a day such as 2026-12-07"),
        ({"to": "2027-02-30"}, "can't read to '2027-02-30' as a date; give a day such as 2026-12-07"),
    ],
)
def test_a_stored_rule_edited_into_nonsense_names_the_field(change, message):
    stored = make_rule("day", "9", "19", MONDAY, MONDAY).to_json()
    with pytest.raises((ValueError, BadInput)) as refused:
        Rule.from_json({**stored, **change})
    assert str(refused.value) == message


def test_with_dates_keeps_the_days_and_times():
    rule = make_rule("weekly", "19:00", "7:00", MONDAY, MONDAY)
    later = rule.with_dates(MONDAY + timedelta(days=7), MONDAY + timedelta(days=21))
    assert later.to_json() == {"every": "week", "days": [0], "start": "19:00", "until": "07:00", "from": "2026-12-14",
                               "to": "2026-12-28"}


@pytest.mark.parametrize(
    "every, start, until, last, message",
    [
        ("day", "9", "19", MONDAY - timedelta(days=1),
         "--to 2026-12-06 is before --from 2026-12-07; the dates are the first and last days of the series"),
        ("day", "9", "9:00", MONDAY, "--until 09:00 is the same time as --start; give the time each occurrence ends,"
         " such as --start 9:00 --until 19:00 (or 19:00 to 07:00 for a night)"),
        ("x" * 45, "9", "19", MONDAY, f"can't read --every '{'x' * 39}…'; use day, weekday, weekend, week, or days such"
         " as mon,wed,fri"),
        ("day", "1" * 45, "19", MONDAY, f"can't read --start '{'1' * 39}…' as a time of day; {CLOCK_HINT}"),
    ],
)
def test_bad_rules_say_exactly_what_to_type(every, start, until, last, message):
    with pytest.raises(BadInput) as refused:
        make_rule(every, start, until, MONDAY, last)
    assert str(refused.value) == message


@pytest.mark.parametrize("text", ["24:30", "9:60", "-1:00"])
def test_clock_times_past_the_day_are_refused(text):
    with pytest.raises(BadInput):
        parse_clock(text, "--start")


def test_the_last_minute_of_the_day_is_a_clock_time():
    assert parse_clock("23:59", "--until") == 23 * 60 + 59


def test_a_long_unreadable_date_is_cut_short_in_the_message():
    with pytest.raises(BadInput) as refused:
        parse_date("2" * 45, "--from")
    assert str(refused.value) == f"can't read --from '{'2' * 39}…' as a date; give a day such as 2026-12-07"


def test_the_local_date_is_the_zones_not_the_process(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        evening = int(datetime(2026, 12, 7, 20, 0, tzinfo=UTC).timestamp())
        assert local_date(evening, ZoneInfo("Asia/Tokyo")) == date(2026, 12, 8)
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    "stored, shown",
    [
        ({}, "every ? ?-?, ? to ?"),  # a row edited by hand still describes, as far as it can
        ({"every": "day", "until": "07:00"}, "every day ?-07:00, ? to ?"),  # not "(next day)": no start to be after
        ({"every": "day", "start": "19:00"}, "every day 19:00-?, ? to ?"),
        ({"every": "week", "start": "09:00", "until": "19:00", "from": "2026-12-07", "to": "2026-12-28"},
         "every week 09:00-19:00, 2026-12-07 to 2026-12-28"),
        ({"every": "week", "days": [2], "start": "19:00", "until": "07:00", "from": "2026-12-09", "to": "2026-12-30"},
         "every week (Wednesday) 19:00-07:00 (next day), 2026-12-09 to 2026-12-30"),
        # until equal to start runs the whole day round, to the next day, as occurrences expands it
        ({"every": "day", "start": "09:00", "until": "09:00", "from": "2026-12-07", "to": "2026-12-07"},
         "every day 09:00-09:00 (next day), 2026-12-07 to 2026-12-07"),
    ],
)
def test_describe(stored, shown):
    assert describe(stored) == shown


def test_a_stored_rule_whose_until_is_its_start_runs_a_whole_day():
    rule = Rule.from_json({"every": "day", "days": [0], "start": "09:00", "until": "09:00", "from": "2026-12-07",
                           "to": "2026-12-07"})
    assert walls(rule, UTC) == [("Mon 07 09:00", "Tue 08 09:00")]


def test_a_series_may_span_exactly_the_most_days():
    rule = make_rule("week", "9", "19", MONDAY, MONDAY + timedelta(days=MAX_SPAN_DAYS))
    assert (rule.last - rule.first).days == MAX_SPAN_DAYS


@pytest.mark.parametrize("text, readable", [
    ("1969-12-31", False), ("1970-01-01", True), ("8999-12-31", True), ("9000-01-01", False), ("9999-12-31", False),
])
def test_a_date_is_read_from_1970_to_8999_where_the_services_times_reach(text, readable):
    """A series' days, a day on and a time zone away, must stay dates (Python's end with 9999): the service's
    times run from 1970 to 9000 (app.service.ops.registry.Time)."""
    if readable:
        assert parse_date(text, "--to").isoformat() == text
    else:
        with pytest.raises(BadInput) as refused:
            parse_date(text, "--to")
        assert str(refused.value) == f"can't read --to '{text}' as a date; give a day such as 2026-12-07"

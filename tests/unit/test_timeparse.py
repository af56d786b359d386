import re
from datetime import datetime, timedelta, timezone
from datetime import time as time_of_day
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.timeparse import (
    TimeInputError,
    parse_duration,
    parse_end,
    parse_range,
    parse_when,
    parse_when_or_range,
)

CET = timezone(timedelta(hours=1))
NOW = datetime(2026, 11, 29, 15, 30, tzinfo=CET)  # a Sunday


def at(*args, tz=CET):
    return datetime(*args, tzinfo=tz)


@pytest.fixture(autouse=True)
def _utc_system(set_tz):
    # System zone disagrees with NOW's fixed +01:00, so NOW's offset is used as the zone:
    # results don't depend on the machine's TZ.
    set_tz("UTC")


# ------------------------------------------------------------- starts

@pytest.mark.parametrize(
    "text, expected",
    [
        ("now", NOW),
        ("  NOW ", NOW),
        ("16:00", at(2026, 11, 29, 16, 0)),
        ("15:29", at(2026, 11, 29, 15, 29)),  # within the 1-minute grace: still today
        ("15:28", at(2026, 11, 30, 15, 28)),  # past: rolls to tomorrow
        ("9:00", at(2026, 11, 30, 9, 0)),
        ("09:05", at(2026, 11, 30, 9, 5)),
        ("23:59", at(2026, 11, 29, 23, 59)),
        ("today 14:00", at(2026, 11, 29, 14, 0)),  # explicit today never rolls
        ("today 18:00", at(2026, 11, 29, 18, 0)),
        ("Tomorrow 9:00", at(2026, 11, 30, 9, 0)),
        ("tomorrow   0:00", at(2026, 11, 30, 0, 0)),
        ("tomorrow", at(2026, 11, 30, 9, 0)),  # day alone = 09:00
        ("tmrw 9:00", at(2026, 11, 30, 9, 0)),
        ("TMR", at(2026, 11, 30, 9, 0)),
        ("mon 9:00", at(2026, 11, 30, 9, 0)),
        ("Monday 9:00", at(2026, 11, 30, 9, 0)),
        ("tue", at(2026, 12, 1, 9, 0)),
        ("wed 10:00", at(2026, 12, 2, 10, 0)),
        ("thurs 8:00", at(2026, 12, 3, 8, 0)),
        ("sat 7:15", at(2026, 12, 5, 7, 15)),
        ("sun 16:00", at(2026, 11, 29, 16, 0)),  # today, still ahead
        ("sun 9:00", at(2026, 12, 6, 9, 0)),  # today but past: next week
        ("sun 15:29", at(2026, 11, 29, 15, 29)),  # within the 1-minute grace: still today
        ("sun 15:28", at(2026, 12, 6, 15, 28)),
        ("sunday", at(2026, 12, 6, 9, 0)),
        ("2026-12-01T14:00", at(2026, 12, 1, 14, 0)),
        ("2026-12-01 14:00", at(2026, 12, 1, 14, 0)),
        ("2026-12-01t14:00:30", at(2026, 12, 1, 14, 0, 30)),
        ("2026-12-01", at(2026, 12, 1, 0, 0)),
        ("2026-12-01T14:00Z", at(2026, 12, 1, 15, 0)),
        ("2026-12-01T14:00+03:00", at(2026, 12, 1, 12, 0)),
        ("2026-12-01T14:00-05:00", at(2026, 12, 1, 20, 0)),
        ("2025-01-01 00:00", at(2025, 1, 1, 0, 0)),  # past ISO is taken as is
        ("+2h", at(2026, 11, 29, 17, 30)),
        ("+90m", at(2026, 11, 29, 17, 0)),
        ("+1h30m", at(2026, 11, 29, 17, 0)),
        ("+2d", at(2026, 12, 1, 15, 30)),
    ],
)
def test_parse_when(text, expected):
    got = parse_when(text, NOW)
    assert got == expected
    assert got.utcoffset() == timedelta(hours=1)  # in now's zone


@pytest.mark.parametrize("text, rolled", [("15:29", at(2026, 11, 30, 15, 29)), ("sun 15:29", at(2026, 12, 6, 15, 29))])
def test_the_grace_is_one_minute_to_the_second(text, rolled):
    # at 15:30:00 a time a minute ago is still today; at 15:30:01 it is a minute and a second ago: the next one
    assert parse_when(text, NOW) == at(2026, 11, 29, 15, 29)
    assert parse_when(text, NOW + timedelta(seconds=1)) == rolled


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("tomorow 9", "can't read 'tomorow 9' as a time"),
        ("", "can't read '' as a time"),
        ("9", "as a time"),  # bare hour is not a start
        ("14h", "as a time"),
        ("tomorrow 9", "as a time"),
        ("25:00", "no such time of day 25:00"),
        ("12:60", "no such time of day"),
        ("2026-02-30", "day is out of range"),
        ("2026-12-01T14:00:61", "second must be in"),
        ("+0m", "at least one minute"),
        ("+99999d", "too long"),
        ("+2", "can't read '+2' as a time"),
        ("9999-12-31T23:59-05:00", "can't use"),  # overflows on conversion
        ("next week", "as a time"),
        ("fr 9:00", "as a time"),  # weekday needs >= 3 letters
    ],
)
def test_parse_when_errors(text, fragment):
    with pytest.raises(TimeInputError) as e:
        parse_when(text, NOW)
    msg = str(e.value)
    assert fragment in msg
    assert "\n" not in msg


def test_error_lists_accepted_forms():
    with pytest.raises(TimeInputError) as e:
        parse_when("tomorow 9", NOW)
    assert str(e.value) == (
        "can't read 'tomorow 9' as a time; use now, 14:00, tomorrow 9:00, mon 9:00, tonight, this weekend, "
        "2026-12-01T14:00 or +2h"
    )


def test_error_is_one_line_for_multiline_input():
    with pytest.raises(TimeInputError) as e:
        parse_when("tomorrow\n\nfoo", NOW)
    assert "\n" not in str(e.value)


def test_long_input_is_shown_cut_to_40_characters():
    forms = "use 90m, 3h, 1h30m, 1.5h, 2d or 1d12h"
    with pytest.raises(TimeInputError) as e:
        parse_duration("x" * 40)
    assert str(e.value) == f"can't read '{'x' * 40}' as a duration; {forms}"
    with pytest.raises(TimeInputError) as e:
        parse_duration("x" * 40 + "y")
    assert str(e.value) == f"can't read '{'x' * 40}...' as a duration; {forms}"


def test_naive_now_is_taken_as_system_local(set_tz):
    set_tz("Europe/Berlin")
    assert parse_when("16:00", datetime(2026, 11, 29, 15, 30)) == at(2026, 11, 29, 16, 0)


# ------------------------------------------------------------- durations

@pytest.mark.parametrize(
    "text, minutes",
    [
        ("90m", 90),
        ("3h", 180),
        ("1h30m", 90),
        ("1h 30m", 90),
        ("2d", 2880),
        ("1d12h", 2160),
        ("1.5h", 90),
        ("0.5d", 720),
        (" 3H ", 180),
        ("2 hours 30 min", 150),
        ("1m", 1),
        ("3650d", 3650 * 1440),
    ],
)
def test_parse_duration(text, minutes):
    assert parse_duration(text) == timedelta(minutes=minutes)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("0m", "at least one minute"),
        ("0h0m", "at least one minute"),
        ("0.2m", "at least one minute"),
        ("-1h", "as a duration"),
        ("45s", "seconds are not supported"),
        ("90", "can't read '90' as a duration; use 90m, 3h"),
        ("", "as a duration"),
        ("h", "as a duration"),
        ("3650d1m", "too long"),
        ("9" * 400 + "d", "too long"),
        ("1e9h", "as a duration"),
        ("30m1h", "as a duration"),
    ],
)
def test_parse_duration_errors(text, fragment):
    with pytest.raises(TimeInputError) as e:
        parse_duration(text)
    assert fragment in str(e.value)


# ------------------------------------------------------------- ranges

@pytest.mark.parametrize(
    "text, start, end",
    [
        ("tomorrow 9-19", at(2026, 11, 30, 9, 0), at(2026, 11, 30, 19, 0)),
        ("14:00-18:00", at(2026, 11, 30, 14, 0), at(2026, 11, 30, 18, 0)),  # start past: tomorrow
        ("16:00 - 18:00", at(2026, 11, 29, 16, 0), at(2026, 11, 29, 18, 0)),
        ("16:15-18", at(2026, 11, 29, 16, 15), at(2026, 11, 29, 18, 0)),
        ("mon 9:00-17:30", at(2026, 11, 30, 9, 0), at(2026, 11, 30, 17, 30)),
        ("today 9-17", at(2026, 11, 29, 9, 0), at(2026, 11, 29, 17, 0)),
        ("2026-12-01T09:00-12:00", at(2026, 12, 1, 9, 0), at(2026, 12, 1, 12, 0)),
        ("2026-12-01 9-12:30", at(2026, 12, 1, 9, 0), at(2026, 12, 1, 12, 30)),
        ("9-19", at(2026, 11, 30, 9, 0), at(2026, 11, 30, 19, 0)),  # past: tomorrow
        ("16-19", at(2026, 11, 29, 16, 0), at(2026, 11, 29, 19, 0)),
        ("22-2", at(2026, 11, 29, 22, 0), at(2026, 11, 30, 2, 0)),  # wraps midnight
        ("sun 23:00-0:30", at(2026, 11, 29, 23, 0), at(2026, 11, 30, 0, 30)),
        ("18-24", at(2026, 11, 29, 18, 0), at(2026, 11, 30, 0, 0)),
        ("sun 9-17", at(2026, 12, 6, 9, 0), at(2026, 12, 6, 17, 0)),  # next week
    ],
)
def test_parse_range(text, start, end):
    assert parse_range(text, NOW) == (start, end)
    assert parse_when_or_range(text, NOW) == (start, end)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("16:30-16:00", "ends at or before it starts"),
        ("16-16", "ends at or before it starts"),
        ("2026-12-01T22:00-02:00", "ends at or before it starts"),  # dated ranges don't wrap
        ("tomorow 9-19", "can't read 'tomorow 9-19' as a time range"),
        ("9-25", "no such time of day"),
        ("24-2", "no such time of day"),
        ("tomorrow 9:00", "as a time range"),
        ("", "as a time range"),
    ],
)
def test_parse_range_errors(text, fragment):
    with pytest.raises(TimeInputError) as e:
        parse_range(text, NOW)
    assert fragment in str(e.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("16:30-16:00", "range '16:30-16:00' ends at or before it starts; "
                        "an end hour smaller than the start hour runs past midnight, e.g. 22-2"),
        ("2026-12-01T22:00-02:00", "range '2026-12-01T22:00-02:00' ends at or before it starts"),  # no wrap hint
        ("tomorow 9-19", "can't read 'tomorow 9-19' as a time range; use 14:00-18:00, tomorrow 9-19, "
                         "mon 9:00-17:30, 22-2 or 2026-12-01T09:00-12:00"),
        ("9-25", "no such time of day 25:00; hours are 0-23, minutes 0-59, e.g. 14:00"),
    ],
    ids=["wraps-hint", "dated-no-hint", "unknown-word", "hour-25"],
)
def test_parse_range_error_messages_say_what_to_do(text, message):
    with pytest.raises(TimeInputError) as e:
        parse_range(text, NOW)
    assert str(e.value) == message


@pytest.mark.parametrize(
    "text, expected",
    [
        ("tomorrow 9:00", (at(2026, 11, 30, 9, 0), None)),
        ("+2h", (at(2026, 11, 29, 17, 30), None)),
        ("2026-12-01", (at(2026, 12, 1, 0, 0), None)),
        # not a valid dated range, so it is a time with a -02:00 offset
        ("2026-12-01T22:00-02:00", (at(2026, 12, 2, 1, 0), None)),
    ],
)
def test_parse_when_or_range_single(text, expected):
    assert parse_when_or_range(text, NOW) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("16:30-16:00", "ends at or before it starts"),
        ("tomorow", "as a time or range; use now, 14:00"),
        ("tomorow", "or a range like 14:00-18:00"),
        ("25:00", "no such time of day"),
    ],
)
def test_parse_when_or_range_errors(text, fragment):
    with pytest.raises(TimeInputError) as e:
        parse_when_or_range(text, NOW)
    assert fragment in str(e.value)


# ------------------------------------------------------------- time zones / DST

def test_tz_env_is_honoured(set_tz):
    set_tz("America/New_York")
    now = datetime(2026, 11, 29, 15, 30).astimezone()  # how the CLI builds now
    assert now.utcoffset() == timedelta(hours=-5)
    got = parse_when("tomorrow 9:00", now)
    assert got.timestamp() == datetime(2026, 11, 30, 14, 0, tzinfo=timezone.utc).timestamp()


def test_fixed_offset_now_across_dst_end_keeps_wall_clock(set_tz):
    # Real CLI use: now from astimezone() is a fixed +02:00, but tomorrow is +01:00.
    set_tz("Europe/Berlin")
    now = datetime(2026, 10, 24, 15, 30).astimezone()
    assert now.utcoffset() == timedelta(hours=2)
    got = parse_when("tomorrow 9:00", now)
    assert (got.hour, got.minute, got.utcoffset()) == (9, 0, timedelta(hours=1))
    assert got.timestamp() == datetime(2026, 10, 25, 8, 0, tzinfo=timezone.utc).timestamp()
    # relative is elapsed time: 24h later the wall clock shows one hour less
    later = parse_when("+24h", now)
    assert later - now == timedelta(hours=24)
    assert (later.day, later.hour) == (25, 14)
    assert later.utcoffset() == timedelta(hours=1)
    start, end = parse_range("tomorrow 0-6", now)
    assert end - start == timedelta(hours=7)  # the night has an extra hour
    assert parse_when("sun 9:00", now) == got


@pytest.mark.parametrize("tz_name", ["Europe/Berlin"])
def test_zoneinfo_now_across_dst_end(tz_name):
    z = ZoneInfo(tz_name)
    now = datetime(2026, 10, 24, 15, 30, tzinfo=z)
    got = parse_when("tomorrow 9:00", now)
    assert got.timestamp() == datetime(2026, 10, 25, 8, 0, tzinfo=timezone.utc).timestamp()
    assert (got.hour, got.utcoffset()) == (9, timedelta(hours=1))
    later = parse_when("+24h", now)
    assert later.timestamp() - now.timestamp() == 24 * 3600
    assert later.hour == 14


def test_seconds_survive_the_system_zone(set_tz):
    set_tz("Europe/Berlin")
    now = datetime(2026, 3, 28, 12, 0).astimezone()
    assert parse_when("2026-03-29 03:30:15", now).time() == time_of_day(3, 30, 15)
    assert parse_when("2026-12-01T14:00:30", now) == datetime(2026, 12, 1, 14, 0, 30, tzinfo=ZoneInfo("Europe/Berlin"))


# Europe/Berlin, 2027: on Sun 28 Mar the clocks go from 02:00 CET to 03:00 CEST (02:00-02:59 never show);
# on Sun 31 Oct from 03:00 CEST back to 02:00 CET (02:00-02:59 show twice).
BERLIN = ZoneInfo("Europe/Berlin")
SPRING_EVE = (2027, 3, 27, 12, 0)  # Saturday noon before each change
AUTUMN_EVE = (2027, 10, 30, 12, 0)
GAP = ("02:{} does not exist on Sun 28 Mar 2027: the clocks go forward from 02:00 (CET) to 03:00 (CEST); give a time"
       " before 02:00 or from 03:00 on")
TWICE = ("02:{0} happens twice on Sun 31 Oct 2027 (the clocks go back); took the first (CEST, UTC+02:00);"
         " write 2027-10-31T02:{0}+01:00 for the second")


def utc(*args) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


def berlin_now(mode: str, *args) -> datetime:
    """Now in Berlin as the CLI has it ("system": TZ set, a fixed offset from astimezone()) or as a real zone."""
    return datetime(*args).astimezone() if mode == "system" else datetime(*args, tzinfo=BERLIN)


@pytest.fixture(params=["system", "zone"])
def berlin_mode(request, set_tz):
    set_tz("Europe/Berlin" if request.param == "system" else "UTC")
    return request.param


@pytest.mark.parametrize("eve, text, instant, note", [
    # spring: the last minute before the gap and the first after it are times; the gap is refused (None)
    (SPRING_EVE, "2027-03-28 01:59", utc(2027, 3, 28, 0, 59), None),
    (SPRING_EVE, "2027-03-28 02:00", None, GAP.format("00")),
    (SPRING_EVE, "2027-03-28T02:30", None, GAP.format("30")),
    (SPRING_EVE, "2027-03-28 02:59", None, GAP.format("59")),
    (SPRING_EVE, "2027-03-28 03:00", utc(2027, 3, 28, 1, 0), None),
    (SPRING_EVE, "tomorrow 2:30", None, GAP.format("30")),
    (SPRING_EVE, "sun 2:30", None, GAP.format("30")),
    (SPRING_EVE, "2027-03-28T02:30+01:00", utc(2027, 3, 28, 1, 30), None),  # an offset names an instant: 03:30 CEST
    # autumn: the hour shown twice is its first occurrence, and a note says how to write the second
    (AUTUMN_EVE, "2027-10-31 01:59", utc(2027, 10, 30, 23, 59), None),
    (AUTUMN_EVE, "2027-10-31 02:00", utc(2027, 10, 31, 0, 0), TWICE.format("00")),
    (AUTUMN_EVE, "2027-10-31T02:30", utc(2027, 10, 31, 0, 30), TWICE.format("30")),
    (AUTUMN_EVE, "tomorrow 2:59", utc(2027, 10, 31, 0, 59), TWICE.format("59")),
    (AUTUMN_EVE, "2027-10-31 03:00", utc(2027, 10, 31, 2, 0), None),
    (AUTUMN_EVE, "2027-10-31T02:30+02:00", utc(2027, 10, 31, 0, 30), None),
    (AUTUMN_EVE, "2027-10-31T02:30+01:00", utc(2027, 10, 31, 1, 30), None),  # the second, as the note says
])
def test_a_start_in_a_gap_is_refused_and_one_shown_twice_is_noted(berlin_mode, eve, text, instant, note):
    now, notes = berlin_now(berlin_mode, *eve), []
    if instant is None:
        with pytest.raises(TimeInputError) as refused:
            parse_when(text, now, notes=notes)
        assert str(refused.value) == note
        return
    assert parse_when(text, now, notes=notes).timestamp() == instant
    assert notes == ([note] if note else [])


@pytest.mark.parametrize("zone, eve, text, offsets, shift", [
    ("America/New_York", (2027, 11, 6, 12, 0), "tomorrow 1:30", ("EDT, UTC-04:00", "2027-11-07T01:30-05:00"), 60),
    ("Europe/London", (2027, 10, 30, 12, 0), "tomorrow 1:30", ("BST, UTC+01:00", "2027-10-31T01:30+00:00"), 60),
    ("Australia/Lord_Howe", (2027, 4, 3, 12, 0), "tomorrow 1:45", ("+11, UTC+11:00", "2027-04-04T01:45+10:30"), 30),
])
def test_the_note_writes_each_offset_as_start_reads_it_west_at_zero_and_by_half_hours(zone, eve, text, offsets, shift):
    # the second occurrence is written with its offset: negative west of Greenwich, +00:00 (not -00:00), 30 minutes
    now, notes = datetime(*eve, tzinfo=ZoneInfo(zone)), []
    first = parse_when(text, now, notes=notes)
    said, second = offsets
    assert notes == [f"{second[11:16]} happens twice on {first:%a %d %b %Y} (the clocks go back); took the first"
                     f" ({said}); write {second} for the second"]
    assert parse_when(second, now).timestamp() - first.timestamp() == shift * 60  # as the note says: the second

@pytest.mark.parametrize("now, text, start, note", [
    # a bare time rolls past a day whose copy of it never shows, and is refused on the day it is asked for
    ((2027, 3, 28, 10, 0), "2:30", utc(2027, 3, 29, 0, 30), None),
    ((2027, 3, 28, 1, 0), "2:30", None, GAP.format("30")),
    ((2027, 3, 28, 1, 0), "now", utc(2027, 3, 28, 0, 0), None),
    ((2027, 10, 31, 10, 0), "2:30", utc(2027, 11, 1, 1, 30), None),
    ((2027, 10, 31, 1, 0), "2:30", utc(2027, 10, 31, 0, 30), TWICE.format("30")),
    ((2027, 3, 28, 10, 0), "sun 2:30", utc(2027, 4, 4, 0, 30), None),  # today's never showed and is past: next week's
    ((2027, 3, 28, 1, 0), "sun 2:30", None, GAP.format("30")),
])
def test_the_day_a_bare_time_is_on_decides(berlin_mode, now, text, start, note):
    notes = []
    if start is None:
        with pytest.raises(TimeInputError, match=f"^{re.escape(note)}$"):
            parse_when(text, berlin_now(berlin_mode, *now), notes=notes)
        return
    assert parse_when(text, berlin_now(berlin_mode, *now), notes=notes).timestamp() == start
    assert notes == ([note] if note else [])


@pytest.mark.parametrize("text, span, note", [
    ("tomorrow 2-4", None, GAP.format("00")),  # starts in the gap
    ("tomorrow 1-2:30", None, GAP.format("30")),  # ends in it
    ("tomorrow 1-3", (utc(2027, 3, 28, 0, 0), utc(2027, 3, 28, 1, 0)), None),  # crosses it: one real hour
    ("2027-03-28 1-3", (utc(2027, 3, 28, 0, 0), utc(2027, 3, 28, 1, 0)), None),
])
def test_a_range_across_the_gap(berlin_mode, text, span, note):
    now = berlin_now(berlin_mode, *SPRING_EVE)
    for parse in (parse_range, lambda t, n, notes: parse_when_or_range(t, n, notes=notes)):
        notes = []
        if span is None:
            with pytest.raises(TimeInputError, match=f"^{re.escape(note)}$"):
                parse(text, now, notes=notes)
            continue
        start, end = parse(text, now, notes=notes)
        assert (start.timestamp(), end.timestamp()) == span and notes == []


@pytest.mark.parametrize("text, span", [
    ("tomorrow 1-2:30", (utc(2027, 10, 30, 23, 0), utc(2027, 10, 31, 0, 30))),  # ends in it
    ("tomorrow 2:30-4", (utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 3, 0))),  # starts in it
    ("2027-10-31 2:30-4", (utc(2027, 10, 31, 0, 30), utc(2027, 10, 31, 3, 0))),
])
def test_a_range_into_the_hour_shown_twice_is_noted_once(berlin_mode, text, span):
    now, notes = berlin_now(berlin_mode, *AUTUMN_EVE), []
    start, end = parse_when_or_range(text, now, notes=notes)
    assert (start.timestamp(), end.timestamp()) == span
    assert notes == [TWICE.format("30")]


def test_an_offset_range_lookalike_leaves_no_note_behind(berlin_mode):
    # '02:30-01:00' on a date is no range (dated ranges never wrap): it is 02:30 at UTC-01:00, which is no wall time here
    now, notes = berlin_now(berlin_mode, *AUTUMN_EVE), []
    start, end = parse_when_or_range("2027-10-31T02:30-01:00", now, notes=notes)
    assert (start.timestamp(), end, notes) == (utc(2027, 10, 31, 3, 30), None, [])


@pytest.mark.parametrize("start, text, end, note", [
    ((2027, 3, 28, 1, 0), "2:30", None, GAP.format("30")),  # the first 02:30 after the start never shows
    ((2027, 3, 28, 1, 0), "3:00", utc(2027, 3, 28, 1, 0), None),  # one real hour
    ((2027, 3, 28, 5, 0), "2:30", utc(2027, 3, 29, 0, 30), None),  # the next day's 02:30
    ((2027, 3, 27, 22, 0), "2027-03-28 02:30", None, GAP.format("30")),
    ((2027, 10, 31, 0, 0), "2:30", utc(2027, 10, 31, 0, 30), TWICE.format("30")),
])
def test_an_end_in_the_gap_is_refused_and_one_shown_twice_is_noted(berlin_mode, start, text, end, note):
    now = berlin_now(berlin_mode, *SPRING_EVE)
    begin, notes = berlin_now(berlin_mode, *start), []
    if end is None:
        with pytest.raises(TimeInputError, match=f"^{re.escape(note)}$"):
            parse_end(text, begin, now, notes=notes)
        return
    assert parse_end(text, begin, now, notes=notes).timestamp() == end
    assert notes == ([note] if note else [])


def test_fixed_offset_not_matching_system_is_used_as_is():
    # autouse fixture set TZ=UTC; NOW is +01:00, so +01:00 is the zone
    got = parse_when("2026-07-01 12:00", NOW)
    assert got == at(2026, 7, 1, 12, 0)
    assert got.utcoffset() == timedelta(hours=1)


def test_a_fixed_offset_does_not_pass_through_the_system_zone(set_tz):
    set_tz("Pacific/Kiritimati")  # +14: there, 9999-12-31 23:00+01:00 would fall in the year 10000
    assert parse_when("9999-12-31 23:00", NOW) == at(9999, 12, 31, 23, 0)


# ------------------------------------------------------------- tonight, this weekend

WEDNESDAY = datetime(2026, 11, 25, 10, 0, tzinfo=CET)


@pytest.mark.parametrize(
    "text, now, night_start, expected",
    [
        ("tonight", WEDNESDAY, 19 * 60, at(2026, 11, 25, 19, 0)),
        ("Tonight", WEDNESDAY, 22 * 60 + 30, at(2026, 11, 25, 22, 30)),  # [booking] night_start = "22:30"
        ("tonight", at(2026, 11, 25, 21, 15), 19 * 60, at(2026, 11, 25, 21, 15)),  # already night: now
        ("tonight", at(2026, 11, 25, 19, 0), 19 * 60, at(2026, 11, 25, 19, 0)),
        ("this weekend", WEDNESDAY, 19 * 60, at(2026, 11, 28, 9, 0)),  # Saturday 09:00
        ("this  WEEKEND", at(2026, 11, 27, 23, 59), 19 * 60, at(2026, 11, 28, 9, 0)),  # Friday night
        ("this weekend", at(2026, 11, 28, 7, 0), 19 * 60, at(2026, 11, 28, 7, 0)),  # Saturday: now
        ("this weekend", NOW, 19 * 60, NOW),  # Sunday: now
    ],
)
def test_tonight_and_this_weekend(text, now, night_start, expected):
    assert parse_when(text, now, night_start=night_start) == expected
    assert parse_when(text, now, night_start=lambda: night_start) == expected


def test_night_start_is_asked_only_for_tonight():
    def unread():
        raise AssertionError("the config was read for a time that does not need it")

    assert parse_when("tomorrow 9:00", NOW, night_start=unread) == at(2026, 11, 30, 9, 0)
    assert parse_end("+2h", NOW, NOW, night_start=unread) == at(2026, 11, 29, 17, 30)


@pytest.mark.parametrize("text", ["tonite", "this week", "weekend", "tonight 22:00", "next weekend"])
def test_other_words_are_not_read(text):
    with pytest.raises(TimeInputError, match="can't read"):
        parse_when(text, NOW)


# ------------------------------------------------------------- ends (--until)

TOMORROW_14 = at(2026, 11, 30, 14, 0)


@pytest.mark.parametrize(
    "text, start, expected",
    [
        # day words read from now, as in --start: the 26-hour booking of issue 11 is two hours
        ("tomorrow 16:00", TOMORROW_14, at(2026, 11, 30, 16, 0)),
        ("mon 18:00", TOMORROW_14, at(2026, 11, 30, 18, 0)),  # Monday is tomorrow, from now
        ("tue", TOMORROW_14, at(2026, 12, 1, 9, 0)),
        ("2026-12-02T12:00", TOMORROW_14, at(2026, 12, 2, 12, 0)),
        ("today 17:00", NOW, at(2026, 11, 29, 17, 0)),
        ("tonight", NOW, at(2026, 11, 29, 19, 0)),
        ("this weekend", at(2026, 11, 29, 15, 0), NOW),  # Sunday: now
        # a bare time: the first such time after the start
        ("18:00", TOMORROW_14, at(2026, 11, 30, 18, 0)),
        ("9:00", TOMORROW_14, at(2026, 12, 1, 9, 0)),
        ("14:00", TOMORROW_14, at(2026, 12, 1, 14, 0)),  # strictly after: the same time is the next day
        ("2:00", at(2026, 11, 29, 22, 0), at(2026, 11, 30, 2, 0)),  # past midnight
        ("16:00", NOW, at(2026, 11, 29, 16, 0)),
        # +DUR: after the start
        ("+2h", TOMORROW_14, at(2026, 11, 30, 16, 0)),
        ("+1h30m", NOW, at(2026, 11, 29, 17, 0)),
        ("+1d", TOMORROW_14, at(2026, 12, 1, 14, 0)),
    ],
)
def test_parse_end(text, start, expected):
    assert parse_end(text, start, NOW) == expected


@pytest.mark.parametrize(
    "text, start, message",
    [
        ("today 16:00", TOMORROW_14, "the end Sun 29 Nov 16:00 is at or before the start Mon 30 Nov 14:00"),
        ("tomorrow 14:00", TOMORROW_14, "the end Mon 30 Nov 14:00 is at or before the start Mon 30 Nov 14:00"),
        ("now", TOMORROW_14, "the end Sun 29 Nov 15:30 is at or before the start Mon 30 Nov 14:00"),
        ("tomorrow 9", NOW, "can't read 'tomorrow 9' as an end; use 18:00 (the first after the start)"),
        ("+soon", NOW, "can't read '+soon' as an end"),
        ("+0m", NOW, "must be at least one minute"),
        ("25:00", NOW, "no such time of day 25:00"),
    ],
)
def test_parse_end_errors(text, start, message):
    with pytest.raises(TimeInputError) as refused:
        parse_end(text, start, NOW)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_an_end_names_what_it_must_follow():
    with pytest.raises(TimeInputError, match="^the end Sun 29 Nov 16:00 is at or before the current end Mon 30 Nov 14:00;"):
        parse_end("today 16:00", TOMORROW_14, NOW, after="the current end")


def test_a_bare_end_keeps_the_wall_clock_across_dst(set_tz):
    set_tz("Europe/Berlin")
    now = datetime(2026, 10, 24, 15, 30).astimezone()  # +02:00; the night to the 25th has 25 hours
    start = parse_when("22:00", now)
    end = parse_end("6:00", start, now)
    assert (end.day, end.hour, end.utcoffset()) == (25, 6, timedelta(hours=1))
    assert end - start == timedelta(hours=9)


# ------------------------------------------------------------- never anything but TimeInputError

_grammarish = st.text(alphabet="0123456789:-+.TtZzdhms amonwrxy\u2013\n\u0663", max_size=30)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=40), _grammarish))
def test_any_text_returns_or_raises_time_input_error(text):
    for fn in (
        lambda: parse_when(text, NOW),
        lambda: parse_duration(text),
        lambda: parse_range(text, NOW),
        lambda: parse_when_or_range(text, NOW),
        lambda: parse_end(text, NOW, NOW),
    ):
        try:
            fn()
        except TimeInputError as e:
            assert "\n" not in str(e)

"""The one parser per grammar: card lists and ids, as typed on the CLI and in the TUI."""

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core.parse import parse_card_spec, parse_cards, parse_id, parse_span
from app.core.text import format_cards
from app.errors import BadInput

UNREADABLE = "; give indexes such as 0,1 or 4-7"


@pytest.mark.parametrize("text, cards", [
    ("0", [0]),
    ("0,1", [0, 1]),
    ("4-7", [4, 5, 6, 7]),
    ("0,2-3", [0, 2, 3]),
    ("0-1,4", [0, 1, 4]),
    ("0, 2-3", [0, 2, 3]),
    (" 1 ,\t0 ", [0, 1]),
    ("4 - 5", [4, 5]),
    ("3-3", [3]),
    ("5,1,5", [1, 5]),
    ("007", [7]),
    ("4096", [4096]),
])
def test_cards_read(text, cards):
    assert parse_cards(text) == cards


@pytest.mark.parametrize("text, shown", [
    ("", "''"),
    (" ", "''"),
    (",", "','"),
    ("0,,1", "'0,,1'"),
    ("0,", "'0,'"),
    (",0", "',0'"),
    ("x", "'x'"),
    ("0x1", "'0x1'"),
    ("-1", "'-1'"),
    ("+1", "'+1'"),
    ("1_0", "'1_0'"),
    ("1.5", "'1.5'"),
    ("4-", "'4-'"),
    ("4-7-9", "'4-7-9'"),
    ("0 1", "'0 1'"),
    ("0,\n1", "'0,\\x0a1'"),  # only spaces and tabs may surround a part
    ("2X", "'2X'"),
    ("0) OR 1=1 --", "'0) OR 1=1 --'"),
    ("\u0663", "'\u0663'"),  # ARABIC-INDIC DIGIT THREE: int() reads it as 3
    ("\uff11", "'\uff11'"),  # FULLWIDTH DIGIT ONE
    ("0-\u0663", "'0-\u0663'"),
    ("\u00b2", "'\u00b2'"),  # SUPERSCRIPT TWO: isdigit() says yes
    ("\x1b[31m1", "'\\x1b[31m1'"),  # escapes shown as text, not sent to the terminal
])
def test_unreadable_cards_are_one_line_bad_input(text, shown):
    with pytest.raises(BadInput) as refused:
        parse_cards(text)
    assert str(refused.value) == f"can't read cards {shown}{UNREADABLE}"


@pytest.mark.parametrize("text, why", [
    ("7-4", "the range 7-4 runs backwards"),
    ("4097", "cards run from 0 to 4096"),
    ("0-4097", "cards run from 0 to 4096"),
    ("99999999999999999999", "cards run from 0 to 4096"),
    ("4294967296", "cards run from 0 to 4096"),
    # past int()'s digit limit: still BadInput, not ValueError
    pytest.param("9" * 5000, "cards run from 0 to 4096", id="5000-digits"),
])
def test_cards_out_of_order_or_range_say_why(text, why):
    with pytest.raises(BadInput, match=f"^can't read cards '.*' \\({why}\\){UNREADABLE}$"):
        parse_cards(text)


@given(st.lists(st.integers(0, 4096), min_size=1, max_size=20))
def test_cards_written_by_format_cards_read_back(cards):
    assert parse_cards(format_cards(cards)) == sorted(set(cards))



@pytest.mark.parametrize("text, spec", [
    ("0-3", (None, [0, 1, 2, 3])),
    ("gpu2:0-3", ("gpu2", [0, 1, 2, 3])),
    ("gpu2:3", ("gpu2", [3])),
    ("gpu2:0,1", ("gpu2", [0, 1])),  # the host names the list that follows it
    (" gpu-2_b : 4 , gpu-2_b:6", ("gpu-2_b", [4, 6])),
])
def test_card_specs_name_a_host_or_this_one(text, spec):
    assert parse_card_spec(text) == spec


@pytest.mark.parametrize("text, message", [
    ("gpu2:0,gpu1:1", "'gpu2:0,gpu1:1' names cards on more than one host; a booking's cards are on one host"
                      " (such as gpu2:0-3)"),
    ("0,gpu2:1", "'0,gpu2:1' names cards on more than one host; a booking's cards are on one host (such as gpu2:0-3)"),
    ("gpu2:", "can't read cards 'gpu2:'; give indexes such as 0,1 or 4-7"),
    ("gpu2:3-1", "can't read cards 'gpu2:3-1' (the range 3-1 runs backwards); give indexes such as 0,1 or 4-7"),
    ("gp u2:1", "can't read cards 'gp u2:1'; give indexes such as 0,1 or 4-7"),
])
def test_card_specs_on_two_hosts_or_unreadable_are_one_line_bad_input(text, message):
    with pytest.raises(BadInput) as refused:
        parse_card_spec(text)
    assert str(refused.value) == message

@pytest.mark.parametrize("text, value", [
    ("1", 1),
    ("12", 12),
    ("007", 7),
    (" 12 ", 12),
    (str(2**63 - 1), 2**63 - 1),
])
def test_ids_read(text, value):
    assert parse_id(text) == value


@pytest.mark.parametrize("text, message", [
    ("0", "there is no booking 0; 'board list' shows the bookings"),
    ("-1", "there is no booking -1; 'board list' shows the bookings"),
    ("+5", "there is no booking +5; 'board list' shows the bookings"),
    ("1_000", "there is no booking 1_000; 'board list' shows the bookings"),
    (str(2**63), f"there is no booking {2**63}; 'board list' shows the bookings"),
    ("99999999999999999999", "there is no booking 99999999999999999999; 'board list' shows the bookings"),
    ("\u0663", "there is no booking \u0663; 'board list' shows the bookings"),
    ("\uff11\uff12", "there is no booking \uff11\uff12; 'board list' shows the bookings"),
    # int() skips a newline; the message must not name booking 12, which may well exist
    ("12\n", "there is no booking 12\\x0a; 'board list' shows the bookings"),
    ("12X", "invalid int value: '12X'; give a booking number such as 12"),
    ("abc", "invalid int value: 'abc'; give a booking number such as 12"),
    ("", "invalid int value: ''; give a booking number such as 12"),
    ("1 OR 1=1", "invalid int value: '1 OR 1=1'; give a booking number such as 12"),
    ("\x1b[2J", "invalid int value: '\\x1b[2J'; give a booking number such as 12"),
    ("\u00b2", "invalid int value: '\u00b2'; give a booking number such as 12"),
])
def test_refused_ids_are_one_line_bad_input(text, message):
    with pytest.raises(BadInput) as refused:
        parse_id(text)
    assert str(refused.value) == message


def test_huge_ids_are_bad_input_and_shortened():
    with pytest.raises(BadInput, match=r"^there is no booking 9{39}…; 'board list' shows the bookings$"):
        parse_id("9" * 5000)


@pytest.mark.parametrize("what, message", [
    ("server", "there is no server 0; 'board serve list' shows the servers"),
    ("job", "there is no job 0"),
])
def test_ids_name_what_they_are(what, message):
    with pytest.raises(BadInput) as refused:
        parse_id("0", what)
    assert str(refused.value) == message
    with pytest.raises(BadInput, match=f"give a {what} number such as 12"):
        parse_id("x", what)


def test_one_span_grammar_for_the_cli_and_the_form():
    from datetime import datetime, timezone

    from app.core.parse import parse_span

    now = datetime(2026, 12, 1, 10, 30, tzinfo=timezone.utc)
    at = lambda h, m=0, day=1: int(datetime(2026, 12, day, h, m, tzinfo=timezone.utc).timestamp())  # noqa: E731
    assert parse_span("now", "2h", None, now, how_long="x") == (at(10, 30), at(12, 30))
    assert parse_span("14:00", None, "18:30", now, how_long="x") == (at(14), at(18, 30))
    assert parse_span("tomorrow 9-19", None, None, now, how_long="x") == (at(9, day=2), at(19, day=2))
    with pytest.raises(BadInput, match="^say how long here$"):
        parse_span("14:00", None, None, now, how_long="say how long here")
    with pytest.raises(BadInput) as refused:
        parse_span("yesterday-ish", "1h", None, now, how_long="x")
    assert str(refused.value) == (  # the time parser's own line, with the forms it reads
        "can't read 'yesterday-ish' as a time or range; use now, 14:00, tomorrow 9:00, mon 9:00, tonight, "
        "this weekend, 2026-12-01T14:00 or +2h; or a range like 14:00-18:00, tomorrow 9-19, mon 9:00-17:30, 22-2 or "
        "2026-12-01T09:00-12:00")
    with pytest.raises(BadInput, match="^that time is out of range$"):  # past the year 9999
        parse_span("9999-12-31T23:00", "2h", None, now, how_long="x")


NOW = datetime(2026, 11, 29, 15, 30, tzinfo=timezone.utc)  # a Sunday, as tests.conftest.FROZEN_NOW


def _at(day: int, h: int, m: int = 0) -> int:
    """Epoch seconds at h:m UTC on 29 November 2026 + (day - 29) days: 30 is Monday, 31 is 1 December."""
    return int(datetime(2026, 11, 29, tzinfo=timezone.utc).timestamp()) + (day - 29) * 86400 + h * 3600 + m * 60


@pytest.mark.parametrize("start, length, until, span", [
    # issue 11: "tomorrow" in --until is read from now, not from the start's day (this booked 26 hours)
    ("tomorrow 14:00", None, "tomorrow 16:00", (_at(30, 14), _at(30, 16))),
    ("tomorrow 14:00", None, "16:00", (_at(30, 14), _at(30, 16))),
    ("tomorrow 14:00", None, "9:00", (_at(30, 14), _at(31, 9))),  # the first 9:00 after the start
    ("tomorrow 14:00", None, "+2h", (_at(30, 14), _at(30, 16))),
    ("22:00", None, "6:00", (_at(29, 22), _at(30, 6))),
    ("tonight", None, "17:00", (_at(29, 19), _at(30, 17))),  # a bare end never falls before its start
    ("tomorrow 9-19", None, "tue 12:00", (_at(30, 9), _at(31, 12))),  # an end overrides the range's
    ("tonight", None, "tomorrow 7:00", (_at(29, 19), _at(30, 7))),
    ("tonight", "10h", None, (_at(29, 19), _at(30, 5))),
    ("this weekend", None, "+1h", (_at(29, 15, 30), _at(29, 16, 30))),  # Sunday: now
    ("now", None, "tonight", (_at(29, 15, 30), _at(29, 19))),
])
def test_until_reads_day_words_from_now_and_bare_times_from_the_start(start, length, until, span):
    assert parse_span(start, length, until, NOW, how_long="x") == span


def test_tonight_is_the_configured_night_start():
    assert parse_span("tonight", "1h", None, NOW, how_long="x", night_start=21 * 60) == (_at(29, 21), _at(29, 22))


@pytest.mark.parametrize("start, until, message", [
    ("tomorrow 14:00", "today 16:00", "the end Sun 29 Nov 16:00 is at or before the start Mon 30 Nov 14:00; "),
    ("tomorrow 9-19", "now", "the end Sun 29 Nov 15:30 is at or before the start Mon 30 Nov 09:00; "),
    ("tonight", "tonight", "the end Sun 29 Nov 19:00 is at or before the start Sun 29 Nov 19:00; "),
])
def test_an_end_at_or_before_the_start_is_bad_input_showing_both(start, until, message):
    with pytest.raises(BadInput) as refused:
        parse_span(start, None, until, NOW, how_long="x")
    assert str(refused.value).startswith(message)



@pytest.fixture(params=["system", "zone"])
def berlin_now(request, monkeypatch):
    """Sat 30 Oct 2027 12:00 in Berlin, the eve of the night its clocks go back at 03:00 (02:00-02:59 show twice): as the
    CLI has it (TZ set, a fixed offset from astimezone()) or as a real zone."""
    import time
    from zoneinfo import ZoneInfo

    monkeypatch.setenv("TZ", "Europe/Berlin" if request.param == "system" else "UTC")
    time.tzset()
    yield (datetime(2027, 10, 30, 12, 0).astimezone() if request.param == "system"
           else datetime(2027, 10, 30, 12, 0, tzinfo=ZoneInfo("Europe/Berlin")))
    monkeypatch.undo()
    time.tzset()


def test_the_notes_of_a_start_and_of_an_end_shown_twice_reach_the_caller(berlin_now):
    twice = ("02:30 happens twice on Sun 31 Oct 2027 (the clocks go back); took the first (CEST, UTC+02:00);"
             " write 2027-10-31T02:30+01:00 for the second")
    first = int(datetime(2027, 10, 31, 0, 30, tzinfo=timezone.utc).timestamp())
    notes: list[str] = []
    assert parse_span("tomorrow 2:30", "1h", None, berlin_now, how_long="x", notes=notes) == (first, first + 3600)
    assert notes == [twice]
    notes = []
    assert parse_span("tomorrow 1:00", None, "2:30", berlin_now, how_long="x", notes=notes) == (first - 5400, first)
    assert notes == [twice]


def test_tonight_in_until_is_the_configured_night_start_too():
    assert parse_span("now", None, "tonight", NOW, how_long="x", night_start=21 * 60) == (_at(29, 15, 30), _at(29, 21))

"""The iCalendar writer (app.core.ical), read back with the icalendar package as a calendar program would."""

import unicodedata
from dataclasses import replace
from datetime import datetime, timezone

import icalendar
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.core import text
from app.core.ical import calendar, card_ranges, fold, inert
from app.core.parse import parse_cards
from app.model import Booking

DOMAIN = "gpu1.example.org"
T0 = 1796461200  # 2026-12-05 09:00 UTC


def booking(id=1, user="alice", cards=(0, 1, 2, 3), start=T0, hours=10, klass="online", note="", status="booked",
            created_at=T0 - 86400, series_id=None) -> Booking:
    return Booking(id=id, user=user, uid=1001, cards=tuple(cards), card_uuids=tuple(f"GPU-{c}" for c in cards),
                   start=start, end=start + hours * 3600, klass=klass, note=note, status=status,
                   created_at=created_at, series_id=series_id)


def events(data: bytes) -> dict[str, icalendar.Event]:
    """UID -> event, after checking the file parses cleanly."""
    cal = icalendar.Calendar.from_ical(data)
    assert cal["VERSION"] == "2.0" and cal["PRODID"]
    found = {str(e["UID"]): e for e in cal.walk("VEVENT")}
    assert len(found) == len(cal.walk("VEVENT")), "UIDs are unique"
    return found


def utc(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)


def test_one_event_per_booking_with_uid_times_summary_and_description():
    data = calendar([booking(note="prod TP4"), booking(id=2, user="bob", cards=(4, 5, 7), klass="batch", hours=2)],
                    domain=DOMAIN)
    found = events(data)
    assert set(found) == {f"board-booking-1@{DOMAIN}", f"board-booking-2@{DOMAIN}"}
    first, second = found[f"board-booking-1@{DOMAIN}"], found[f"board-booking-2@{DOMAIN}"]
    assert first["SUMMARY"] == "alice · cards 0-3 · online"
    assert second["SUMMARY"] == "bob · cards 4-5,7 · batch"
    assert first["DESCRIPTION"] == "prod TP4\n\nboard booking #1"
    assert second["DESCRIPTION"] == "board booking #2"
    assert first["DTSTART"].dt == utc(T0) and first["DTEND"].dt == utc(T0 + 10 * 3600)
    assert first["DTSTAMP"].dt == utc(T0 - 86400)  # when it was booked: not the time of the export
    assert b"DTSTART:20261205T090000Z\r\n" in data  # UTC, whatever the exporter's zone


def test_cancelled_bookings_are_left_out():
    found = events(calendar([booking(), booking(id=2, cards=(5,), status="cancelled")], domain=DOMAIN))
    assert list(found) == [f"board-booking-1@{DOMAIN}"]


def test_an_empty_selection_is_still_a_calendar():
    cal = icalendar.Calendar.from_ical(calendar([], domain=DOMAIN))
    assert cal.walk("VEVENT") == [] and cal["X-WR-CALNAME"] == "board"


def test_series_occurrences_are_instances_naming_their_series():
    days = [booking(id=10 + n, start=T0 + n * 86400, series_id=7) for n in range(3)]
    found = events(calendar([*days, booking(id=20, cards=(6,), start=T0 + 3600)], domain=DOMAIN))
    series = [e for e in found.values() if "series 7" in e["CATEGORIES"].cats]
    assert sorted(e["DTSTART"].dt for e in series) == [utc(T0 + n * 86400) for n in range(3)]
    assert all(e["DESCRIPTION"].endswith(", series 7") for e in series)
    assert found[f"board-booking-20@{DOMAIN}"]["CATEGORIES"].cats == ["online"]


HOSTILE = [
    "\x1b[31mred\x1b[0m \x1b]8;;http://evil/\x07link",  # terminal colours and a hyperlink
    "abc\u202edcba zero\u200bwidth nul\x00 c1\x9b",  # bidi override, zero-width, NUL, C1
    "x\r\nEND:VEVENT\r\nBEGIN:VEVENT\r\nUID:evil@x\r\nSUMMARY:free cards\r\nEND:VEVENT",  # a forged event
    "a;b,c\\d\\n:e",  # TEXT's own escapes
    "line\u2028sep\rcr",
]


@pytest.mark.parametrize("note", HOSTILE)
def test_notes_and_names_from_other_users_stay_inert(note):
    data = calendar([booking(note=note, user="m\x1b[2Jallory;,")], domain=DOMAIN)
    found = events(data)
    assert list(found) == [f"board-booking-1@{DOMAIN}"]  # nothing forged
    event = found[f"board-booking-1@{DOMAIN}"]
    shown = str(event["DESCRIPTION"])
    lines = shown.split("\n")
    # Line breaks stay line breaks; nothing else a terminal or renderer would act on survives.
    assert not [c for c in shown.replace("\n", "") if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]
    assert lines[-2:] == ["", "board booking #1"]
    assert str(event["SUMMARY"]) == "m\\x1b[2Jallory;, · cards 0-3 · online"
    assert b"\x1b" not in data and b"\x00" not in data
    if note.startswith("a;b"):
        assert lines[0] == note  # escaped on the wire, read back exactly


def test_a_hostile_note_is_shown_with_visible_escapes():
    event = events(calendar([booking(note="\x1b[31mred")], domain=DOMAIN))[f"board-booking-1@{DOMAIN}"]
    assert event["DESCRIPTION"].startswith("\\x1b[31mred\n")


def test_text_values_are_escaped_on_the_wire():
    # icalendar reads some unescaped commas and semicolons leniently; other readers split on them.
    data = calendar([booking(note="a;b,c\\d", user="x;y,z")], domain=DOMAIN)
    assert "SUMMARY:x\\;y\\,z · cards 0-3 · online\r\n".encode() in data
    assert b"DESCRIPTION:a\\;b\\,c\\\\d\\n\\nboard booking #1\r\n" in data


def test_the_same_bookings_give_the_same_bytes_in_any_order():
    bookings = [booking(id=n, cards=(n % 8,), start=T0 + n * 3600, note=f"job {n}") for n in range(1, 30)]
    first = calendar(bookings, domain=DOMAIN)
    assert calendar(list(reversed(bookings)), domain=DOMAIN) == first
    assert calendar(bookings, domain=DOMAIN) == first


def test_a_changed_booking_changes_only_its_own_event():
    bookings = [booking(id=n, cards=(n % 8,), start=T0 + n * 3600, note=f"job {n}") for n in range(1, 30)]
    before = calendar(bookings, domain=DOMAIN).split(b"\r\n")
    # Moved to the end of the calendar and given a longer note: its position in the file stays.
    bookings[4] = replace(bookings[4], start=T0 + 90 * 3600, end=T0 + 92 * 3600, note="moved " * 30)
    after = calendar(bookings, domain=DOMAIN).split(b"\r\n")
    begin = before.index(b"UID:board-booking-5@" + DOMAIN.encode()) - 1
    end_before = before.index(b"END:VEVENT", begin) + 1
    end_after = after.index(b"END:VEVENT", begin) + 1
    assert before[:begin] == after[:begin] and before[end_before:] == after[end_after:]
    assert before[begin:end_before] != after[begin:end_after]


def test_every_physical_line_is_at_most_75_octets_and_valid_utf8():
    data = calendar([booking(note="é" * 100 + "👩\u200d💻" * 40 + "x" * 200, user="ünïcødé" * 10)], domain=DOMAIN)
    assert data.endswith(b"END:VCALENDAR\r\n") and b"\n" not in data.replace(b"\r\n", b"")
    for line in data.split(b"\r\n"):
        assert len(line) <= 75
        line.decode("utf-8")  # no character cut in two


@pytest.mark.parametrize("line, pieces", [
    ("x" * 75, ["x" * 75]),
    ("x" * 76, ["x" * 75, " x"]),
    ("x" * 149, ["x" * 75, " " + "x" * 74]),
    ("x" * 150, ["x" * 75, " " + "x" * 74, " x"]),
    ("x" * 74 + "é", ["x" * 74, " é"]),  # 76 octets: the two-byte character moves whole to the next line
])
def test_fold_at_75_octets(line, pieces):
    assert fold(line).split("\r\n") == pieces


@given(st.text(max_size=400))
def test_folding_unfolds_to_the_same_line(value):
    line = "DESCRIPTION:" + value.replace("\r", "").replace("\n", "")
    folded = fold(line)
    pieces = folded.encode("utf-8").split(b"\r\n")
    assert all(len(p) <= 75 for p in pieces) and all(p.startswith(b" ") for p in pieces[1:])
    assert folded.replace("\r\n ", "") == line


@given(st.text(max_size=50))
def test_the_fast_path_past_inert_changes_nothing(note):
    assert inert(note) == text.inert(note)


@pytest.mark.parametrize("cards, shown", [
    ((0,), "0"), ((0, 1, 2, 3), "0-3"), ((4, 5, 7), "4-5,7"), ((0, 2, 4), "0,2,4"), ((7, 6, 5, 0), "0,5-7"),
])
def test_card_ranges_are_the_grammar_people_type(cards, shown):
    assert card_ranges(cards) == shown
    assert parse_cards(shown) == sorted(cards)


def test_the_file_is_exactly_the_rfc_5545_lines_a_strict_reader_expects():
    # Property names and fixed values are upper case, as RFC 5545 writes them; the note's CRLF and LF
    # line breaks both become one \n.
    data = calendar([booking(hours=2, note="line one\r\nline two\nthree", series_id=4)], domain=DOMAIN)
    assert data.decode("utf-8").split("\r\n") == [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        "PRODID:-//board//board ical//EN",
        "CALSCALE:GREGORIAN",
        "X-WR-CALNAME:board",
        "REFRESH-INTERVAL;VALUE=DURATION:PT15M",
        "X-PUBLISHED-TTL:PT15M",
        "BEGIN:VEVENT",
        f"UID:board-booking-1@{DOMAIN}",
        "DTSTAMP:20261204T090000Z",
        "DTSTART:20261205T090000Z",
        "DTEND:20261205T110000Z",
        "SUMMARY:alice · cards 0-3 · online",
        "DESCRIPTION:line one\\nline two\\nthree\\n\\nboard booking #1\\, series 4",
        "CATEGORIES:online,series 4",
        "STATUS:CONFIRMED",
        "END:VEVENT",
        "END:VCALENDAR",
        "",
    ]

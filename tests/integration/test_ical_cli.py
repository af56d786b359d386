"""`board ical` as a user runs it: the real CLI on a real database file, its output read with the icalendar package."""

import os
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import icalendar
import pytest

from app.store import bookings as rows
from app.store.db import connect
from tests.conftest import REPO, run_board

HOST = socket.gethostname()
HOSTILE = "x\nEND:VEVENT\nBEGIN:VEVENT\nUID:forged\n\x1b[31mfree; cards, \\all\u202e"


def at(day: datetime, hour: int) -> int:
    return int((day + timedelta(hours=hour)).timestamp())


@pytest.fixture
def seeded(tmp_path):
    """A database with: my booking (cards 0-1) and a cancelled one, booked through the CLI; bob's on cards 4-5 with a
    hostile note; carol's standing slot on cards 6-7 (three days, series 1); bob's a month ago and in four months."""
    db = tmp_path / "board.db"
    env = {"BOARD_DB": str(db), "BOARD_SIMULATE": "1", "TZ": "UTC"}

    def board(*args, tz="UTC"):
        if args[0] != "ical":
            return run_board(*args, env={**env, "TZ": tz})
        # As run_board, but the calendar's bytes as written: CRLF line ends and all.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("BOARD_")}
        result = subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, env={**clean, **env, "TZ": tz},
                                cwd=REPO, timeout=60)
        return subprocess.CompletedProcess(result.args, result.returncode, result.stdout, result.stderr.decode())

    # Absolute times two days on: every command means the same instants, however long apart they run.
    day = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=2)
    mine = ok(board("book", "--cards", "0-1", "--start", f"{day:%Y-%m-%d}T10:00", "--for", "2h", "--class", "batch",
                    "--note", "eval, run 3; see \\\\share\nsecond line"))
    cancelled = ok(board("book", "--cards", "2", "--start", f"{day:%Y-%m-%d}T10:00", "--for", "1h"))
    ok(board("cancel", booking_id(cancelled)))
    conn = connect(db)
    uuid = {idx: uuid for uuid, idx in conn.execute("SELECT uuid, idx FROM cards")}
    made = int(time.time()) - 3600

    def add(user, cards, start, end, klass="experiment", note="", series_id=None):
        return rows.insert(conn, user=user, uid=2000, uuids=[uuid[c] for c in cards], start=start, end=end, klass=klass,
                           note=note, request=None, now=made, created_by=0, series_id=series_id)

    with conn:
        ids = {"bob": add("bob", (4, 5), at(day, 10), at(day, 12), "online", HOSTILE)}
        series = conn.execute("INSERT INTO series (user, uid, rule, created_at) VALUES ('carol', 2001, '{}', ?)",
                              (made,)).lastrowid
        ids["carol"] = [add("carol", (6, 7), at(day, 24 * n + 9), at(day, 24 * n + 19), "online", "prod TP4", series)
                        for n in range(3)]
        now = datetime.now(timezone.utc)
        ids["past"] = add("bob", (3,), at(now - timedelta(days=30), 0), at(now - timedelta(days=30), 1))
        ids["far"] = add("bob", (3,), at(now + timedelta(days=120), 0), at(now + timedelta(days=120), 1))
    conn.close()
    ids.update(mine=int(booking_id(mine)), cancelled=int(booking_id(cancelled)), series=series, day=day,
               me=board("whoami").stdout.split()[0])
    return board, ids


def ok(result):
    assert result.returncode == 0, result.stderr
    return result


def booking_id(result) -> str:
    return result.stdout.split()[1].lstrip("#")


def export(board, *args, tz="UTC") -> tuple[bytes, dict[int, icalendar.Event]]:
    """The file's bytes, and booking id -> its event."""
    result = ok(board("ical", *args, tz=tz))
    assert result.stderr == ""
    data = result.stdout
    found = {}
    for event in icalendar.Calendar.from_ical(data).walk("VEVENT"):
        name, at_sign, host = str(event["UID"]).partition("@")
        assert name.startswith("board-booking-") and (at_sign, host) == ("@", HOST)
        found[int(name.removeprefix("board-booking-"))] = event
    return data, found


def test_the_default_export_has_everyones_live_bookings_from_a_week_ago_to_90_days_on(seeded):
    board, ids = seeded
    _, found = export(board)
    assert sorted(found) == sorted([ids["mine"], ids["bob"], *ids["carol"]])  # not cancelled, past or far
    mine, bob = found[ids["mine"]], found[ids["bob"]]
    assert mine["SUMMARY"] == f"{ids['me']} · cards 0-1 · batch"
    assert mine["DESCRIPTION"] == f"eval, run 3; see \\\\share\nsecond line\n\nboard booking #{ids['mine']}"
    assert mine["DTSTART"].dt == ids["day"] + timedelta(hours=10) and mine["DTEND"].dt == ids["day"] + timedelta(hours=12)
    assert bob["SUMMARY"] == "bob · cards 4-5 · online"
    # The forged event stays text inside bob's description; the escape and the bidi override are shown, not obeyed.
    assert bob["DESCRIPTION"] == ("x\nEND:VEVENT\nBEGIN:VEVENT\nUID:forged\n\\x1b[31mfree; cards, \\all\\u202e"
                                  f"\n\nboard booking #{ids['bob']}")
    for n, occurrence in enumerate(ids["carol"]):
        event = found[occurrence]
        assert event["DTSTART"].dt == ids["day"] + timedelta(days=n, hours=9)
        assert f"series {ids['series']}" in event["CATEGORIES"].cats


@pytest.mark.parametrize("args, expected", [
    (["--mine"], ["mine"]),
    (["--user", "bob"], ["bob"]),
    (["--user", "bob", "--all"], ["bob", "past", "far"]),
    (["--cards", "6-7"], ["carol"]),
    (["--cards", "0,4"], ["mine", "bob"]),
    (["--mine", "--cards", "4-7"], []),
    (["--all"], ["mine", "bob", "carol", "past", "far"]),
    (["--from", "+100d"], ["far"]),  # the default --to is 90 days after --from when that is later than now
    (["--from", "+121d", "--all"], []),
])
def test_selection(seeded, args, expected):
    board, ids = seeded
    wanted = []
    for name in expected:
        wanted += ids[name] if isinstance(ids[name], list) else [ids[name]]
    assert sorted(export(board, *args)[1]) == sorted(wanted)


def test_a_window_keeps_the_bookings_that_overlap_it(seeded):
    board, ids = seeded
    day = ids["day"]
    _, found = export(board, "--from", f"{day:%Y-%m-%d}T20:00", "--to", f"{day + timedelta(days=1):%Y-%m-%d}T10:00")
    assert list(found) == [ids["carol"][1]]


def test_a_reexport_of_unchanged_bookings_is_byte_identical_in_any_zone(seeded):
    board, _ = seeded
    first, _ = export(board)
    assert export(board)[0] == first
    assert export(board, tz="Asia/Tokyo")[0] == first


def test_a_changed_booking_changes_only_its_own_event(seeded):
    board, ids = seeded
    before, _ = export(board)
    ok(board("extend", str(ids["mine"]), "--for", "1h"))
    after, found = export(board)
    assert found[ids["mine"]]["DTEND"].dt == ids["day"] + timedelta(hours=13)

    def without_mine(data: bytes) -> list[bytes]:
        lines = data.split(b"\r\n")
        begin = lines.index(f"UID:board-booking-{ids['mine']}@{HOST}".encode()) - 1
        return lines[:begin] + lines[lines.index(b"END:VEVENT", begin) + 1:]

    assert after != before and without_mine(after) == without_mine(before)


@pytest.mark.parametrize("args, message", [
    (["--from", "someday"], "can't read 'someday' as a time"),
    (["--from", "tomorrow 10:00", "--to", "tomorrow 9:00"], "is not after --from"),
    (["--cards", "9-1"], "runs backwards"),
    (["--user", "no-such-user-here"], "no user 'no-such-user-here'"),
    (["--mine", "--user", "bob"], "not allowed with argument --mine"),
])
def test_bad_input_is_one_line_exit_2_and_no_calendar(seeded, args, message):
    board, _ = seeded
    result = board("ical", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1
    assert result.stdout == b""


def test_a_window_keeps_what_began_before_it_and_leaves_what_touches_its_edges(seeded):
    """--from 11:00 --to 19:00 on the day: my booking and bob's (10:00-12:00) began before it and run into it, carol's
    first occurrence (09:00-19:00) runs through it. From 19:00 to 09:00 the next day touches carol's first occurrence
    at its end and her second at its start: neither is in it (half-open); a minute wider on each side takes both.

    Wrong versions it fails on: the listing's `starts_at >= from` (what began before is lost); `ends_at >= from` or
    `starts_at <= to` (what touches an edge comes in)."""
    board, ids = seeded
    day, next_day = ids["day"], ids["day"] + timedelta(days=1)
    _, found = export(board, "--from", f"{day:%Y-%m-%d}T11:00", "--to", f"{day:%Y-%m-%d}T19:00")
    assert sorted(found) == sorted([ids["mine"], ids["bob"], ids["carol"][0]])
    _, found = export(board, "--from", f"{day:%Y-%m-%d}T19:00", "--to", f"{next_day:%Y-%m-%d}T09:00")
    assert list(found) == []
    _, found = export(board, "--from", f"{day:%Y-%m-%d}T18:59", "--to", f"{next_day:%Y-%m-%d}T09:01")
    assert sorted(found) == ids["carol"][:2]

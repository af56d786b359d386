"""`board book --every` and `board series` as a user runs them: a real subprocess, a database file, the simulated fleet."""

from __future__ import annotations

import json
import pwd
import os

import pytest

from tests.conftest import day, one_line, run_board

ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def board(tmp_path):
    env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC"}
    return lambda *args: run_board(*args, env=env)


def test_skipped_conflicts_are_notes_and_the_rest_is_booked(board):
    held = board("book", "--cards", "2", "--start", f"{day(2)}T10:00", "--for", "1h", "--json")
    holder = json.loads(held.stdout)["id"]
    refused = board("book", "--cards", "2,3", "--every", "day", "--start", "9", "--until", "17", "--from", day(1),
                    "--to", day(3))
    assert refused.returncode == 3 and f"(booking {holder})" in one_line(refused)
    made = board("book", "--cards", "2,3", "--every", "day", "--start", "9-17", "--from", day(1), "--to", day(3),
                 "--skip-conflicts", "--note", "eval")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(f"booked series 1 {ME}: cards 2,3 experiment, every day 09:00-17:00,"
                                  f" {day(1)} to {day(3)}  eval (2 bookings)\n")
    (note,) = made.stderr.splitlines()
    assert note.startswith("board: note: skipped ") and f"card 2 is booked by {ME}" in note and f"(booking {holder})" in note


def test_extend_and_show(board):
    assert board("book", "--cards", "5", "--class", "finetune", "--every", "weekend", "--start", "19:00", "--until",
                 "7:00", "--to", day(7)).returncode == 0
    grown = board("series", "extend", "1", "--to", day(21))
    assert grown.returncode == 0 and grown.stdout.startswith(f"extended series 1 {ME}: cards 5 finetune, every weekend"
                                                             f" 19:00-07:00 (next day), ")
    assert "(4 bookings)" in grown.stdout and f"to {day(21)}" in grown.stdout
    shown = board("series", "show", "1", "--json")
    found = json.loads(shown.stdout)
    assert found["series"]["rule"]["to"] == day(21) and len(found["bookings"]) >= 5
    assert all(b["start"].endswith("T19:00:00+00:00") and b["series_id"] == 1 for b in found["bookings"])
    listed = board("series", "show", "1")
    assert len(listed.stdout.splitlines()) == 1 + len(found["bookings"])


@pytest.mark.parametrize(
    "args, message",
    [
        (("book", "2", "--every", "day", "--start", "9", "--until", "10", "--to", "+3d"), "give --cards"),
        (("book", "--cards", "1", "--for", "1h", "--to", "+3d"), "--to is for a series; add --every"),
        (("book", "--cards", "1", "--every", "day", "--start", "9", "--for", "1h", "--to", "+3d"),
         "give --start and --until as times of day"),
        (("book", "--cards", "1", "--every", "day", "--until", "10", "--to", "+3d"),
         "give --start and --until as times of day"),
        (("book", "--cards", "1", "--every", "day", "--start", "9", "--until", "10", "--from", "+5d", "--to", "+3d"),
         "is before --from"),
        (("book", "--cards", "1", "--every", "day", "--start", "9", "--until", "10", "--to", "someday"),
         "can't read --to 'someday' as a day"),
        (("book", "--cards", "1", "--every", "mon,funday", "--start", "9", "--until", "10", "--to", "+9d"),
         "can't read --every 'mon,funday'"),
        (("series",), "say which: board series show SID"),
        (("series", "show", "99"), "no series 99"),
        (("series", "cancel", "x"), "give a series number"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(board, args, message):
    result = board(*args)
    assert result.returncode == 2 and message in one_line(result)
    assert json.loads(board("list", "--all", "--json").stdout)["bookings"] == []


def test_help_says_how_a_series_reads():
    text = run_board("book", "--help").stdout
    for words in ("--every DAYS", "--skip-conflicts", "--override-policy", "max_ahead_days", "policy zone",
                  "ends the next morning"):
        assert words in " ".join(text.split()), words
    assert run_board("series", "--help").returncode == 0

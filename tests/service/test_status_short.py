"""`board status --short`: one line per card, gpustat-like, for scripts and `watch`; through the socket and in file
mode alike, on the quick path."""

from __future__ import annotations

import os
import re
import time

import pytest

from app.cli.status import short_lines, wants_colour
from app.core.text import format_time
from app.quick import parse
from tests.conftest import run_board, sqlite_only

# '[3] RTX 5090 | 61°C  87 % | 24.1/31.8 GiB | root until 18:00'
LINE = re.compile(r"^\[(\d)\] RTX 5090 \| +\d+°C +\d+ % \| +\d+\.\d/31\.8 GiB \| (.*)$")


@sqlite_only
def test_each_card_is_one_line_with_its_holder_and_until(cli, client):
    """The default simulated fleet, card 3 booked for two hours: eight lines, card 3's names its holder and end,
    the squatted cards say who squats them, and the columns line up (watch shows a steady table).
    Wrong versions: the next booking's user shown as the holder; the holder's start instead of its end; the memory
    column not padded (a ragged table); the SQUATTED flag dropped."""
    start = int(time.time())
    booking = client.call("book", cards=[3], start=start, end=start + 2 * 3600)
    before = time.time()
    rc, out, err = cli("status", "--short")
    after = time.time()
    assert (rc, err) == (0, ""), err
    lines = out.splitlines()
    assert [LINE.match(line).group(1) for line in lines] == [str(i) for i in range(8)], out
    assert LINE.match(lines[3]).group(2) in {f"{booking['user']} until {format_time(booking['end'], now)}"
                                              for now in (before, after)}
    assert LINE.match(lines[4]).group(2) == "free"
    assert LINE.match(lines[0]).group(2) == "free | SQUATTED by alice"
    assert LINE.match(lines[7]).group(2) == "free | HOT"
    assert len({tuple(i for i, char in enumerate(line) if char == "|")[:3] for line in lines}) == 1, out
    assert "\x1b" not in out  # not a terminal: no colour


@sqlite_only
def test_short_with_json_is_bad_input_in_one_line(cli):
    """--json already carries every field: the two together are refused, not one silently preferred.
    Wrong versions: --short wins (exit 0, lines); the quick path takes it and prints JSON."""
    rc, out, err = cli("status", "--short", "--json")
    assert (rc, out) == (2, "")
    assert err == "board status: argument --json: not allowed with argument --short; see 'board status --help'\n"
    assert parse(["status", "--short", "--json"]) is None  # the full parser words the refusal


def test_a_lost_card_keeps_its_line(tmp_path):
    """A card that fell off the bus has no reading: its line says LOST, and the others keep theirs.
    Wrong versions: the lost card's line dropped (seven lines); n/a columns instead of the word LOST."""
    (tmp_path / "fleet.toml").write_text("[faults]\nlost = [2]\n")
    result = run_board("status", "--short",
                       env={"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": str(tmp_path / "fleet.toml")})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 8
    assert lines[2] == "[2] RTX 5090 | LOST: the driver no longer sees it | free"
    assert LINE.match(lines[3]), lines[3]


def wire_card(index: int, **changes) -> dict:
    """A card as the `status` reply carries it: the fields --short reads."""
    card = {"index": index, "host": "", "name": "NVIDIA GeForce RTX 5090", "state": "FREE", "warnings": [],
            "users": [], "temperature_c": 40, "utilization_pct": 5, "memory_used_mib": 512,
            "memory_total_mib": 32607, "booking": None, "next_booking": None}
    return {**card, **changes}


NOW = 1_796_000_000.0  # a pinned clock


def test_names_from_users_are_inert_and_colour_is_for_terminals_only():
    """A holder, a next holder and a squatter whose names carry escapes are shown as visible escapes; colour codes
    appear only when asked, and a name shorter than the column is padded before it is painted.
    Wrong versions: the raw user name (the terminal obeys ESC[2J); colour on a pipe."""
    evil = "eve\x1b[2J"
    found = {"simulated": True, "hosts": [], "cards": [
        wire_card(0, state="IN USE", users=[evil], booking={"user": evil, "end": int(NOW) + 3600}),
        wire_card(1, state="SQUATTED", users=[evil], next_booking={"user": evil, "start": int(NOW) + 7200}),
    ]}
    plain = short_lines(found, NOW)
    assert "\x1b" not in "".join(plain)
    assert plain[0].endswith(f"| eve\\x1b[2J until {format_time(int(NOW) + 3600, NOW)}")
    assert plain[1].endswith(f"| free until {format_time(int(NOW) + 7200, NOW)} (eve\\x1b[2J)"
                             " | SQUATTED by eve\\x1b[2J")
    painted = short_lines(found, NOW, colour=True)
    assert "\x1b[31mSQUATTED by eve\\x1b[2J\x1b[0m" in painted[1]
    assert re.sub(r"\x1b\[\d+m", "", painted[0]) == plain[0]


def test_wants_colour_on_a_terminal_unless_no_color(tmp_path):
    """Wrong versions: colour on a pipe or a file; NO_COLOR or TERM=dumb ignored."""
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty, open(tmp_path / "out", "w") as file:
        assert wants_colour(tty, {"TERM": "xterm"})
        assert not wants_colour(tty, {"TERM": "xterm", "NO_COLOR": "1"})
        assert not wants_colour(tty, {"TERM": "dumb"})
        assert not wants_colour(file, {"TERM": "xterm"})
    os.close(leader)


@pytest.mark.parametrize("hosts", [1, 2])
def test_a_host_down_and_many_hosts(hosts):
    """On a board of several hosts each card is named host:index, as --cards names it; a card whose host is silent
    says HOST DOWN with the time of its last heartbeat, not its stale reading.
    Wrong versions: hosts named on a one-host board; the stale temperature shown beside HOST DOWN."""
    found = {"simulated": False, "hosts": [{"host": f"gpu{n}"} for n in range(hosts)], "cards": [
        wire_card(0, host="gpu0"), wire_card(1, host="gpu1", host_down=True, down_since=NOW - 600)]}
    lines = short_lines(found, NOW)
    where = ["[gpu0:0]", "[gpu1:1]"] if hosts == 2 else ["[0]", "[1]"]
    assert [line.split(" ")[0] for line in lines] == where
    assert lines[1].endswith(f"| HOST DOWN since {format_time(int(NOW) - 600, NOW)} | free")

"""Refusals say the real reason (issue 11, section 2), with the seeds' pools, through the real CLI on a real database:
a rule is exit 4 and names the rule, a conflict is exit 3 and names the holder, and a suggested start is one the rules take.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import run_board

POOLS = """
[policy]
timezone = "UTC"

[[pools]]
name = "prod"
cards = [0, 1, 2, 3]
classes = ["online", "batch", "finetune"]
[pools.windows]
finetune = { hours = "19:00-07:00", weekends = false }

[[pools]]
name = "lab"
cards = [4, 5, 6, 7]
classes = ["experiment", "batch"]
max_hours = 12
"""


@pytest.fixture
def board(tmp_path):
    config = tmp_path / "board.toml"
    config.write_text(f'[storage]\ndb = "{tmp_path / "board.db"}"\n' + POOLS)
    env = {"BOARD_CONFIG": str(config), "BOARD_SIMULATE": "1", "TZ": "UTC", "HOME": str(tmp_path)}

    def run(*args: str):
        result = run_board(*args, env=env)
        assert "Traceback" not in result.stderr, result.stderr
        return result

    return run


def next_tuesday() -> str:
    """A Tuesday more than a week ahead, as the date the CLI reads: the finetune window has no weekends, and a time
    more than a week ahead is worded as its date (a nearer one by its weekday, which the tests do not expect)."""
    day = datetime.now(timezone.utc).date() + timedelta(days=8)
    while day.weekday() != 1:
        day += timedelta(days=1)
    return day.isoformat()


def bookings(board) -> list[dict]:
    return json.loads(board("list", "--json").stdout)["bookings"]


def test_a_finetune_by_day_on_prod_is_a_rule_named_with_exit_4(board):
    day = next_tuesday()
    result = board("book", "4", "--class", "finetune", "--start", f"{day} 10:00", "--for", "16h")
    assert result.returncode == 4
    assert "class finetune is allowed on pool prod only 19:00-07:00" in result.stderr
    assert "class finetune is not allowed on pool lab" in result.stderr
    assert "no start within 30 days works either" in result.stderr  # 16 h never fits a 12 h window
    assert bookings(board) == []


def test_the_suggested_start_is_one_the_rules_accept(board):
    day = next_tuesday()
    refused = board("book", "4", "--class", "finetune", "--start", f"{day} 10:00", "--for", "10h")
    assert refused.returncode == 4
    suggested = re.search(r"the earliest start that works: (\S+ \S+|\S+) \(in [^)]*\) on cards 0,1,2,3", refused.stderr)
    assert suggested, refused.stderr
    assert suggested.group(1).endswith("19:00")
    taken = board("book", "4", "--class", "finetune", "--start", f"{day} 19:00", "--for", "10h", "--json")
    assert taken.returncode == 0, taken.stderr
    assert json.loads(taken.stdout)["cards"] == [0, 1, 2, 3]
    asked = board("book", "4", "--class", "finetune", "--start", f"{day} 10:00", "--for", "10h", "--or-later", "--json")
    assert asked.returncode == 0, asked.stderr  # the next night, as the prod cards are taken tonight
    assert json.loads(asked.stdout)["start"].startswith(
        (datetime.fromisoformat(day) + timedelta(days=1)).date().isoformat() + "T19:00")


def test_a_13_hour_lab_booking_names_the_12_hour_cap(board):
    result = board("book", "1", "--start", f"{next_tuesday()} 08:00", "--for", "13h")
    assert result.returncode == 4 and "pool lab allows at most 12 h per booking" in result.stderr
    assert "class experiment is not allowed on pool prod" in result.stderr
    assert bookings(board) == []


def test_an_online_day_is_not_moved_to_the_night(board):
    day = next_tuesday()
    batch = board("book", "--class", "batch", "--cards", "0-3", "--start", f"{day} 9-19", "--json")
    assert batch.returncode == 0, batch.stderr
    result = board("book", "4", "--class", "online", "--start", f"{day} 9-19")
    assert result.returncode == 3
    held = json.loads(batch.stdout)["id"]
    assert "cards 0,1,2,3 are booked by" in result.stderr and f" from {day} 09:00 (in" in result.stderr
    assert f" to {day} 19:00 (booking {held})" in result.stderr
    assert len(bookings(board)) == 1


def test_explicit_cards_against_a_window_name_the_card_and_the_rule(board):
    result = board("book", "--cards", "0", "--class", "finetune", "--start", f"{next_tuesday()} 12:00", "--for", "2h")
    assert result.returncode == 4
    assert result.stderr.startswith("board: card 0: class finetune is allowed on pool prod only 19:00-07:00 (UTC);")
    assert "next free start for cards 0:" in result.stderr and "19:00" in result.stderr

"""`board book` says on stderr which cards it passed over, or which named cards run someone else's work."""

import json

import pytest

from tests.conftest import run_board

# Bob (not the caller) runs a 9 GiB job on card 0.
SCENARIO = """\
[cards]
count = 4

[[processes]]
card = 0
pid = 41001
used_mib = 9216
user = "bob"
uid = 1002
"""


@pytest.fixture
def board(tmp_path):
    scenario = tmp_path / "fleet.toml"
    scenario.write_text(SCENARIO)
    env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": str(scenario), "TZ": "UTC"}
    return lambda *args: run_board(*args, env=env)


def test_a_count_passes_over_a_card_with_another_users_job(board):
    result = board("book", "1", "--for", "1h")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("booked #1 ") and " cards 1 " in result.stdout
    assert result.stderr == "board: note: passed over card 0 (bob's processes, 9.0 GiB)\n"


def test_named_cards_are_booked_with_a_note_and_the_json_keeps_its_shape(board):
    result = board("book", "--cards", "0", "--for", "1h", "--json")
    assert result.returncode == 0, result.stderr
    booking = json.loads(result.stdout)
    assert set(booking) == {"id", "user", "cards", "card_uuids", "start", "end", "class", "note", "status"}
    assert booking["cards"] == [0]
    assert result.stderr == "board: note: card 0 has bob's processes (9.0 GiB) now\n"


def test_a_later_slot_says_nothing(board):
    result = board("book", "1", "--start", "tomorrow 09:00", "--for", "1h")
    assert result.returncode == 0, result.stderr
    assert " cards 0 " in result.stdout and result.stderr == ""

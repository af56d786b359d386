"""Ask in memory, not in cards, through the real CLI: `fit --for` (where and when), `book --model`
(the smallest group that fits, with the request stored), and what `list` and `status` show of it."""

import json
import re

import pytest

from tests.conftest import run_board
from tests.fit.shapes import write_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(write_model(tmp_path_factory.mktemp("models") / "gqa8.gguf", "gqa8"))


def test_fit_for_names_the_earliest_cards_that_are_free_now(bobs_board, model):
    result = bobs_board("fit", model, "--for", "3h", "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["smallest_fit"] == 1
    assert [s["cards"] for s in found["slots"]] == [[1]]  # card 0 runs bob's job now
    text = bobs_board("fit", model, "--for", "3h").stdout
    assert text.splitlines()[-1] == "when: now: cards 1"


def test_a_slot_cut_short_by_a_booking_says_until_when(bobs_board, model):
    assert bobs_board("book", "--cards", "1,2,3", "--start", "+2h", "--for", "5h").returncode == 0
    last = bobs_board("fit", model, "--for", "1h").stdout.splitlines()[-1]
    # card 1 is free for 2 h only; from when the booking ends, card 0 (bob's job does not count later)
    # (2 h or 7 h from now may be tomorrow: then the time says its day)
    assert re.fullmatch(r"when: now: cards 1 until (\w{3} )?\d\d:\d\d only; from (\w{3} )?\d\d:\d\d: cards 0", last), last


def test_book_by_model_takes_the_smallest_group_and_stores_the_request(bobs_board, model):
    result = bobs_board("book", "--model", model, "--ctx", "8192", "--parallel", "2", "--for", "2h", "--json")
    assert result.returncode == 0, result.stderr
    booking = json.loads(result.stdout)
    assert booking["cards"] == [1]
    request = booking["request"]
    assert (request["model"], request["ctx"], request["parallel"], request["cache_type_k"]) == (model, 8192, 2, "f16")
    assert len(request["per_card_mib"]) == 1 and 500 < request["per_card_mib"][0] < 1000
    listed = bobs_board("list").stdout
    assert f"[gqa8.gguf ctx 8,192 ×2, ~{request['per_card_mib'][0] / 1024:.1f} GiB/card]" in listed
    card_1 = bobs_board("status").stdout.splitlines()[3]
    assert re.match(rf"1\s+BOOKED\s+\S+\s+{request['per_card_mib'][0] / 1024:.1f}\s", card_1), card_1


def test_book_by_model_refuses_a_count_it_does_not_fit(bobs_board, model, tmp_path):
    config = tmp_path / "board.toml"
    config.write_text("[fit]\ncard_mib = 600\n")
    result = run_board("book", "1", "--model", model, "--ctx", "65536", "--for", "1h",
                       env={"BOARD_DB": str(tmp_path / "b.db"), "BOARD_SIMULATE": "1", "BOARD_CONFIG": str(config)})
    assert result.returncode == 4
    assert "does not fit" in result.stderr and "would fit: --ctx" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b.db").exists() or "no bookings" in run_board(
        "list", env={"BOARD_DB": str(tmp_path / "b.db"), "BOARD_SIMULATE": "1"}).stdout


def test_book_needs_cards_a_count_or_a_model(bobs_board):
    result = bobs_board("book", "--for", "1h")
    assert result.returncode == 2
    assert "--model M.gguf" in result.stderr


def test_serve_start_refuses_settings_that_do_not_fit_the_booked_cards(bobs_board, model):
    booked = json.loads(bobs_board("book", "--model", model, "--for", "1h", "--json").stdout)
    result = bobs_board("serve", "start", str(booked["id"]), "--ctx", "999999999", "--parallel", "64", "--no-wait")
    assert result.returncode == 4
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert line.startswith("board: serve start: gqa8.gguf does not fit: card 0 of 1 needs ")
    assert "would fit: --ctx " in line
    assert bobs_board("serve", "list").stdout.startswith("no servers")

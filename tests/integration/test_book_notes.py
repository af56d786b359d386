"""`board book` says on stderr which cards it passed over, or which named cards run someone else's work."""

import json


def test_a_count_passes_over_a_card_with_another_users_job(bobs_board):
    result = bobs_board("book", "1", "--for", "1h")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("booked #1 ") and " cards 1 " in result.stdout
    assert result.stderr == "board: note: passed over card 0 (bob's processes, 9.0 GiB)\n"


def test_named_cards_are_booked_with_a_note_and_the_json_keeps_its_shape(bobs_board):
    result = bobs_board("book", "--cards", "0", "--for", "1h", "--json")
    assert result.returncode == 0, result.stderr
    booking = json.loads(result.stdout)
    assert set(booking) == {"id", "user", "cards", "card_uuids", "start", "end", "class", "note", "status",
                            "requested_at", "queued", "series_id", "notice", "host"}
    assert booking["cards"] == [0]
    assert result.stderr == "board: note: card 0 has bob's processes (9.0 GiB) now\n"


def test_a_later_slot_says_nothing(bobs_board):
    result = bobs_board("book", "1", "--start", "tomorrow 09:00", "--for", "1h")
    assert result.returncode == 0, result.stderr
    assert " cards 0 " in result.stdout and result.stderr == ""

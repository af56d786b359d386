"""The card table's model without Textual (app.tui.card_table_model): which columns fit, what each cell says and
in which style, and when a holder is over the booking's request. The widget is tested in test_tui_behaviour and
the snapshots."""

from __future__ import annotations

from dataclasses import replace

import pytest
from msgspec import structs

from app.core.cardstate import fleet_status
from app.gpu.model import CardReading, GpuProcess
from app.model import Booking
from app.tui.card_table_model import cell_parts, over_request, table_columns, wants_requests
from tests.tui.conftest import FROZEN_NOW, HOUR, simulated

FLEET = simulated().read()


def plain(parts: dict[str, tuple]) -> dict[str, str]:
    return {column: "".join(text for text, _ in pieces) for column, (pieces, _) in parts.items()}


def statuses(*bookings: Booking, labels=None):
    return fleet_status(FLEET, bookings, FROZEN_NOW, labels=labels or {})


def booked(card: int, user: str = "alice", request=None, start=FROZEN_NOW - HOUR, end=FROZEN_NOW + 3 * HOUR) -> Booking:
    return Booking(1, user, 1001, (card,), (FLEET.cards[card].uuid,), int(start), int(end), "batch", "", "booked",
                   request=request)


def test_the_model_imports_without_textual():
    from tests.unit.test_import_hygiene import loaded_after

    loaded = loaded_after("import app.tui.card_table_model")
    assert "app.tui.card_table_model" in loaded and "textual" not in loaded


class TestColumns:
    def test_compact_columns_are_fixed(self):
        assert [key for key, _, _ in table_columns(statuses(), wide=False, width=200)] == [
            "idx", "state", "vram", "util", "temp", "power", "holder", "next"]

    def test_wide_columns_fill_the_width_with_the_users_and_make_room_for_labels_and_requests(self):
        wide = table_columns(statuses(), wide=True, width=140)
        assert [key for key, _, _ in wide][-1] == "users"
        assert sum(w + 2 for _, _, w in wide) + 1 == 140  # the users column takes the rest, less a scrollbar
        labelled = dict((k, w) for k, _, w in table_columns(statuses(labels={3: "rack"}), wide=True, width=140))
        assert labelled["idx"] == 8
        requests = dict((k, w) for k, _, w in table_columns(statuses(), wide=True, width=140, with_requests=True))
        assert requests["vram"] == 26 and requests["users"] == dict((k, w) for k, _, w in wide)["users"] - 6

    def test_a_mixed_fleet_names_each_cards_model(self):
        cards = (structs.replace(FLEET.cards[0], name="NVIDIA H100"), *FLEET.cards[1:])
        mixed = fleet_status(structs.replace(FLEET, cards=cards), (), FROZEN_NOW)
        assert "gpu" in [key for key, _, _ in table_columns(mixed, wide=True, width=140)]
        assert "gpu" not in [key for key, _, _ in table_columns(statuses(), wide=True, width=140)]

    def test_requests_are_shown_only_wide_and_only_when_a_booking_has_one(self):
        with_request = statuses(booked(4, request={"per_card_mib": [20000]}))
        assert wants_requests(with_request, wide=True)
        assert not wants_requests(with_request, wide=False)
        assert not wants_requests(statuses(booked(4)), wide=True)


class TestCells:
    def test_a_booked_card_names_its_holder_and_marks_my_own(self):
        status = statuses(booked(4, user="alice"))[4]
        mine = cell_parts(status, FROZEN_NOW, me="alice", wide=False)
        assert plain(mine)["holder"] == "alice→18:30" and mine["holder"][0][0] == ("alice", "cards--mine")
        theirs = cell_parts(status, FROZEN_NOW, me="bob", wide=True)
        assert plain(theirs)["holder"] == "alice → 18:30" and theirs["holder"][0][0] == ("alice ", "")

    @pytest.mark.parametrize("wide", [False, True], ids=["80x24", "wide"])
    def test_a_long_name_gives_way_to_the_time_beside_it(self, wide):
        """Issue 31 §8: at 80x24 ten-letter names cut HOLDER and NEXT to 'aud4_al…→06:…'. The time stays whole."""
        holder_until, next_start = FROZEN_NOW + 3 * HOUR, FROZEN_NOW + 2 * 86400  # 18:30 today, Tue
        status = statuses(booked(4, user="aud4_alice", end=holder_until),
                          booked(4, user="aud4_bobby", start=next_start, end=next_start + HOUR))[4]
        cells = plain(cell_parts(status, FROZEN_NOW, me="alice", wide=wide))
        widths = {key: width for key, _, width in table_columns(statuses(), wide=wide, width=140)}
        until, starts = ("→ 18:30", "Tue 15:30") if wide else ("→18:30", "Tue 15h")
        for column, time_text, name in (("holder", until, "aud4_alice"), ("next", starts, "aud4_bobby")):
            assert len(cells[column]) <= widths[column], cells[column]  # nothing for the table to cut
            assert cells[column].endswith(time_text), cells[column]
            shown = cells[column][: -len(time_text)].rstrip()
            assert shown.endswith("…") and name.startswith(shown[:-1]) and len(shown) >= 4, cells[column]

    def test_a_free_card_has_no_holder_and_figures_read_as_the_driver_gave_them(self):
        status = statuses()[4]
        cells = plain(cell_parts(status, FROZEN_NOW, me="alice", wide=False))
        assert (cells["state"], cells["holder"], cells["next"]) == ("FREE", "-", "-")
        reading = status.reading
        assert cells["util"] == f"{reading.utilization_pct}%" and cells["temp"] == f"{reading.temperature_c}°"
        unknown = replace(status, reading=structs.replace(reading, utilization_pct=None, power_w=None))
        parts = cell_parts(unknown, FROZEN_NOW, me="alice", wide=True)
        assert parts["util"] == ((("n/a", "cards--na"),), "right") and plain(parts)["power"] == "n/a"

    def test_the_request_is_beside_the_vram_when_there_is_room(self):
        status = statuses(booked(4, request={"per_card_mib": [20000]}))[4]
        assert plain(cell_parts(status, FROZEN_NOW, me="alice", wide=True, with_requests=True))["vram"].endswith(
            " req 19.5")
        assert "req" not in plain(cell_parts(status, FROZEN_NOW, me="alice", wide=True))["vram"]

    def test_other_peoples_text_is_inert(self):
        status = statuses(booked(4, user="[b]\x1bx"))[4]
        assert plain(cell_parts(status, FROZEN_NOW, me="alice", wide=True))["holder"] == "[b]\\x1bx → 18:30"


@pytest.mark.parametrize("request_, holder_mib, over", [
    ({"per_card_mib": [20000, 20000]}, 21000, False),  # 5 % over: within the margin
    ({"per_card_mib": [20000, 20000]}, 21001, True),
    ({"per_card_mib": [30000, 20000]}, 21001, False),  # the estimate is per card, in the booking's card order
    ({"per_card_mib": [20000]}, 99999, False),  # one figure for two cards: not a request the board can read
    ({"per_card_mib": "20000"}, 99999, False),
    ({"per_card_mib": [True, True]}, 99999, False),
    ({"per_card_mib": [0, 0]}, 99999, False),
    ({"model": "qwen"}, 99999, False),
    (None, 99999, False),
])
def test_over_the_request(request_, holder_mib, over):
    booking = Booking(id=1, user="alice", uid=1001, cards=(4, 5), card_uuids=("GPU-4", "GPU-5"), start=0, end=1,
                      klass="experiment", note="", status="booked", request=request_)
    processes = (GpuProcess(1, holder_mib - 1000, "alice", 1001, ""), GpuProcess(2, 1000, None, None, ""),
                 GpuProcess(3, 5000, "bob", 1002, ""), GpuProcess(4, None, "alice", 1001, ""))
    reading = CardReading(index=4, uuid="GPU-4", memory_total_mib=32607, processes=processes)
    assert over_request(reading, booking) is over


class TestProjects:
    def test_the_holder_carries_the_bookings_project_and_gives_way_with_the_name(self):
        """The project beside the holder on a board with projects ('alice·A'); a booking without one (a board without
        projects) reads as it always did. Wrong versions: the project left out, or shown for the implicit project
        ('alice·'), or the time cut before the name."""
        status = statuses(replace(booked(4, user="alice"), project="A"))[4]
        assert plain(cell_parts(status, FROZEN_NOW, me="bob", wide=False))["holder"] == "alice·A→18:30"
        assert plain(cell_parts(status, FROZEN_NOW, me="bob", wide=True))["holder"] == "alice·A → 18:30"
        plain_board = statuses(booked(4, user="alice"))[4]
        assert plain(cell_parts(plain_board, FROZEN_NOW, me="bob", wide=False))["holder"] == "alice→18:30"
        long = statuses(replace(booked(4, user="aud4_alice"), project="finetuning"))[4]
        assert plain(cell_parts(long, FROZEN_NOW, me="bob", wide=False))["holder"] == "aud4_a…→18:30"

    def test_a_project_with_markup_and_escapes_is_inert(self):
        """Wrong version: the project appended raw after the inert name (its escape reaches the terminal)."""
        status = statuses(replace(booked(4, user="al"), project="\x1b[b"))[4]
        assert cell_parts(status, FROZEN_NOW, me="bob", wide=True)["holder"][0] == (("al·\\x1b[b ", ""),
                                                                                  ("→ 18:30", ""))

    def test_the_project_gives_way_before_the_holders_name(self):
        """Wrong versions: 'alic…' (the name cut for a project that does not fit anyway), 'alice·…'."""
        from app.tui.render import holder

        b = replace(booked(4, user="alice"), project="research")
        assert [holder(b, limit) for limit in (None, 14, 10, 8, 7, 5, 4)] == [
            "alice·research", "alice·research", "alice·res…", "alice·r…", "alice", "alice", "ali…"]

    def test_in_the_holder_column_the_project_goes_before_the_name_is_cut(self):
        status = statuses(replace(booked(4, user="alice", end=FROZEN_NOW + 86400), project="research"))[4]
        assert plain(cell_parts(status, FROZEN_NOW, me="bob", wide=True))["holder"] == "alice → Mon 15:30"

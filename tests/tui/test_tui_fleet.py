"""Many hosts, one board: another host's cards in the card table (under host headings, HOST DOWN when its service
is silent), the timeline, the bookings lists, and bookable from the form as `gpu2:3`."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Input

from app.tui.screens.booking_form import BookingModal
from app.tui.screens.my_bookings import MyBookingsScreen
from tests.tui.conftest import GPU1, ready, wait_for

pytestmark = pytest.mark.asyncio


def cells(table, row: int) -> dict[str, str]:
    return dict(zip(table.column_keys, (str(c) for c in table.get_row_at(row))))


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_a_down_hosts_cards_follow_this_hosts_under_its_heading_and_read_host_down_blanked(
        make_app, second_host, size):
    second_host(down=True)
    app = make_app(config=GPU1)
    async with app.run_test(size=size) as pilot:
        await ready(pilot)
        table = app.board.card_table
        assert [s.host for s in table.statuses] == ["gpu1"] * 8 + ["gpu2"] * 8
        assert table._display == ["gpu1", *range(8), "gpu2", *range(8, 16)]  # a heading above each host's cards
        down = cells(table, 8 + 4)
        assert down["state"] == "HOST DOWN (since 15:28)"
        assert [down[c] for c in ("vram", "util", "temp", "power")] == [""] * 4  # its stale telemetry: blank
        assert down["holder"].startswith("bob")  # its bookings stay
        assert cells(table, 4)["holder"] == "-"  # gpu1's card 4 is another card
        # the state spills into the blank columns, whole, at 80 columns too
        table.move_cursor(row=8 + 4)
        await pilot.pause()
        assert any("HOST DOWN (since 15:28)" in line.text for line in _lines(table))
        assert [r.label for r in app.board.timeline.model.rows] == [*(f"gpu1:{i}" for i in range(8)),
                                                                    *(f"gpu2:{i}" for i in range(8))]


def _lines(widget) -> list:
    return [widget.render_line(y) for y in range(widget.size.height)]


async def test_one_host_shows_no_headings(make_app):
    app = make_app(config=GPU1)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        assert app.board.card_table._display == list(range(8))


async def test_a_remote_card_is_booked_from_the_form_by_its_host_and_listed_as_gpu2(make_app, second_host):
    gpu2 = second_host()
    app = make_app(config=GPU1)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        table = app.board.card_table
        assert table._display[9] == "gpu2" and cells(table, 8 + 4)["state"] == "BOOKED"  # up: today's telemetry
        table.focus()
        table.move_cursor(row=8 + 3)
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, BookingModal))
        assert app.screen.query_one("#cards", Input).value == "gpu2:3"  # the card choice names the host
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, BookingModal))
        (made,) = [b for b in app.client.call("list", start=None, end=None, user="alice")["bookings"] if b["host"] == "gpu2"]
        gpu2_card3 = gpu2.service.fleet.latest().cards[3].uuid
        assert (made["host"], made["cards"], made["card_uuids"]) == ("gpu2", [3], [gpu2_card3])
        await wait_for(pilot, lambda: any(b.id == made["id"] for b in app.view.upcoming))
        upcoming = app.board.query_one("#upcoming", DataTable)
        assert str(upcoming.get_cell(str(made["id"]), "cards")) == "gpu2:3"
        await pilot.press("m")
        await wait_for(pilot, lambda: isinstance(app.screen, MyBookingsScreen))
        mine = app.screen.query_one(DataTable)
        assert str(mine.get_cell(str(made["id"]), "cards")) == "gpu2:3"

"""What the board's screens say reads right: the header on every screen (its fleet, the board's trouble and the
service's alerts), times with their day and never cut, no "n/a/575", a label apart from its field, "card 4"."""

from __future__ import annotations

import html
import re
import time
from dataclasses import replace

from app.gpu.simulated import DEFAULT_FLEET
from app.tui.messages import DatabaseFailed
from app.tui.screens.my_bookings import MyBookingsScreen
from app.tui.widgets.header import BoardHeader
from tests.tui.conftest import ERIN_ADMIN, ready, seed, simulated, wait_for
from tests.tui.test_tui_alerts import add_alerts

DOWN = "the board service is not running (systemctl status board-agent)"


def lines(widget) -> list[str]:
    return [widget.render_line(y).text for y in range(widget.size.height)]


async def opened(pilot, kind: str):
    """The screen on top, once it is of this kind and composed."""
    app = pilot.app
    await wait_for(pilot, lambda: type(app.screen).__name__ == kind and app.screen.query(BoardHeader))
    await pilot.pause()
    return app.screen


class TestHeader:
    async def test_the_fleet_is_a_run_of_its_own_in_a_screenshot(self, make_app):
        """A terminal shows ' gpu-box  8 × RTX 5090'; an SVG screenshot's renderer may drop the spaces that start a
        run of text (rsvg-convert drew 'gpu-box8 × RTX 5090'), so the fleet must not start with them."""
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            header = app.board.query_one(BoardHeader)
            assert header.render().plain.startswith(" gpu-box  8 × RTX 5090  ")
            svg = app.export_screenshot()
        runs = [html.unescape(t).replace("\xa0", " ")
                for t in re.findall(r'<text [^>]*clip-path="url\(#terminal-[\w-]*line-0\)">([^<]*)</text>', svg)]
        fleet = next(run for run in runs if "RTX" in run)
        assert fleet.startswith("8 × RTX 5090"), runs

    async def test_every_screen_shows_the_fleet_and_the_services_alerts(self, make_app, seeded_db):
        add_alerts(seeded_db, ("hot", "GPU-7", "GPU 7 at 93 °C (at or over 92 °C)", None, time.time()))
        app = make_app(identity=ERIN_ADMIN)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await wait_for(pilot, lambda: app.board.query_one(BoardHeader).alerts)
            for open_it, kind in ((app.action_my_bookings, "MyBookingsScreen"),
                                  (lambda: app.action_card_detail(app.statuses[0].reading.uuid), "CardDetailScreen"),
                                  (app.action_admin, "AdminScreen"), (app.action_servers, "ServersScreen")):
                open_it()
                header = (await opened(pilot, kind)).query_one(BoardHeader)
                assert header.alerts == "⚠ GPU 7 at 93 °C (at or over 92 °C)", kind
                assert "8 × RTX 5090" in header.render().plain, kind
                app.pop_screen()
                await wait_for(pilot, lambda: app.screen is app.board)

    async def test_the_service_down_line_says_board_not_bookings_and_a_stall_does_not_hide_it(self, make_app):
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            app.action_my_bookings()  # the line shows on the screen the user is on, too
            await opened(pilot, "MyBookingsScreen")
            app.post_message(DatabaseFailed(DOWN))  # what the events loop posts for the socket's "down" event
            await wait_for(pilot, lambda: app.alert)
            line = f"board: {DOWN}"  # the CLI's own line
            assert app.alert == line
            assert app.screen.query_one(BoardHeader).alert == app.board.query_one(BoardHeader).alert == line
            app.last_telemetry = time.monotonic() - 60  # nothing comes from a service that is down
            app._tick()
            assert app.alert == line
            app.reload_bookings()  # the service answers again
            await wait_for(pilot, lambda: app.alert == "")
            assert app.screen.query_one(BoardHeader).alert == ""


class TestTimes:
    async def test_card_detail_shows_a_far_end_whole(self, make_app, tmp_path):
        path = tmp_path / "far.db"
        seed(path, simulated(), extra=(("frank", (4,), 240, 2, "batch", "ten days on"),))
        app = make_app(db_path=path)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            app.action_card_detail(app.statuses[4].reading.uuid)
            table = (await opened(pilot, "CardDetailScreen")).query_one("#bookings")
            await wait_for(pilot, lambda: table.row_count == 2)
            await pilot.pause()
            row = next(line for line in lines(table) if line.split()[:2] == ["7", "frank"])
            assert "12-09 15:00" in row and "12-09 17:00" in row, row  # not "12-09 17:0"

    async def test_next_at_80_columns_names_another_days_booking(self, make_app):
        """It is Sunday 15:30; frank's booking starts Monday 11:00, less than 20 h away."""
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            table = app.board.card_table
            assert table.get_row_at(4)[-1].plain == "frank Mon 11h"  # not "frank 11:00"
            assert table.get_row_at(7)[-1].plain == "erin 17:00"  # today's keeps its minutes


class TestCards:
    async def test_a_lost_cards_power_is_n_a_without_its_limit(self, make_app):
        app = make_app(source=simulated(replace(DEFAULT_FLEET, lost=frozenset({3}))))
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            app.action_card_detail(app.statuses[3].reading.uuid)
            facts = str((await opened(pilot, "CardDetailScreen")).query_one("#facts").render())
            assert facts.startswith("VRAM n/a · ") and "power n/a\n" in facts, facts  # not "n/a/31.8", "n/a/575 W"

    async def test_the_extend_label_stands_apart_from_its_field(self, make_app):
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, MyBookingsScreen))
            await wait_for(pilot, lambda: app.screen.selected() is not None)
            await pilot.press("e")
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ExtendModal")
            await pilot.pause()
            label, field = app.screen.query_one("Label.field"), app.screen.query_one("#extend")
            assert str(label.render()) == "Add or end"
            assert field.region.x > label.region.x + len("Add or end")  # not "Add or end1h"

"""Snapshot tests at 80x24 (compact) and 120x40 (wide): frozen clock, UTC, fixed fleet and bookings, host 'gpu-box'.

Update with the whole TUI suite (syrupy prunes snapshots it did not see):
    .venv/bin/pytest tests/tui --snapshot-update
and look at the SVGs (rsvg-convert -o x.png file.svg) before committing them.
"""

from __future__ import annotations


import pytest
from msgspec import structs

from app.config import Config
from app.demo import demo_config
from app.tui.screens.admin import AdminScreen
from app.tui.screens.booking_form import BookingModal
from app.tui.screens.card_detail import CardDetailScreen
from tests.tui.conftest import (ERIN_ADMIN, GPU1, HOSTILE_NOTE, HOSTILE_USER, hostile_scenario, ready, seed, seed_demo,
                                settle, simulated, wait_for)

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
DEMO = demo_config(Config())  # prod 0-3 (finetune 19:00-09:00 and weekends), lab 4-7 (≤12 h)


class TestBoard:
    @SIZES
    def test_main_board(self, snap_compare, make_app, size):
        assert snap_compare(make_app(), terminal_size=size, run_before=ready)


class TestTimeline:
    @SIZES
    def test_week_view(self, snap_compare, make_app, size):
        async def week(pilot):
            await ready(pilot)
            await pilot.press("tab", "z")
            app = pilot.app
            await wait_for(pilot, lambda: app.view.window_start == app.board.timeline.model.view_start)

        assert snap_compare(make_app(), terminal_size=size, run_before=week)

    @SIZES
    def test_keyboard_selection(self, snap_compare, make_app, size):
        async def select(pilot):
            await ready(pilot)
            await pilot.press("tab", "down", "down", "down", "down", "right", "right",
                              "shift+down", "shift+right", "shift+right", "shift+right")

        assert snap_compare(make_app(), terminal_size=size, run_before=select)


class TestBookingForm:
    @SIZES
    def test_form_shows_the_conflict(self, snap_compare, make_app, size):
        async def conflict(pilot):
            await ready(pilot)
            await pilot.press("down", "down", "b")  # card 2 is bob's
            app = pilot.app
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal) and app.screen.error is not None)

        assert snap_compare(make_app(), terminal_size=size, run_before=conflict)


class TestCardDetail:
    @SIZES
    def test_card_detail(self, snap_compare, make_app, size):
        async def detail(pilot):
            await ready(pilot)
            await pilot.press("enter")
            # The charts drawn from the service's history (a replay of the simulated fleet here), not before.
            await wait_for(pilot, lambda: isinstance(pilot.app.screen, CardDetailScreen)
                           and pilot.app.screen.points is not None)

        assert snap_compare(make_app(), terminal_size=size, run_before=detail)


class TestAdmin:
    @SIZES
    def test_admin_screen(self, snap_compare, make_app, size):
        async def admin(pilot):
            await ready(pilot)
            await pilot.press("a")
            app = pilot.app
            await wait_for(pilot, lambda: isinstance(app.screen, AdminScreen) and len(app.screen.bookings) == 6)
            await wait_for(pilot, lambda: app.screen.query_one("#audit").row_count == 6)
            await settle(pilot)  # the table widens its columns to the rows after they arrive (narrow under load)

        assert snap_compare(make_app(identity=ERIN_ADMIN), terminal_size=size, run_before=admin)


class TestUntrustedText:
    @SIZES
    def test_hostile_text_is_inert(self, snap_compare, make_app, tmp_path, size):
        """A username, note and command line with ANSI/OSC escapes, markup, bidi and zero-width characters."""
        source = simulated(hostile_scenario())
        db = tmp_path / "hostile.db"
        seed(db, source, extra=((HOSTILE_USER, (4,), -1, 3, "experiment", HOSTILE_NOTE),))

        async def cursor_on_it(pilot):
            await ready(pilot)
            await pilot.press("tab", "down", "down", "down", "down")

        assert snap_compare(make_app(source=source, db_path=db), terminal_size=size, run_before=cursor_on_it)

    @SIZES
    def test_hostile_process_in_card_detail(self, snap_compare, make_app, tmp_path, size):
        source = simulated(hostile_scenario())
        db = tmp_path / "hostile.db"
        seed(db, source, extra=((HOSTILE_USER, (4,), -1, 3, "experiment", HOSTILE_NOTE),))

        async def detail(pilot):
            await ready(pilot)
            await pilot.press("down", "down", "down", "down", "enter")
            # The charts drawn from the service's history (a replay of the simulated fleet here), not before.
            await wait_for(pilot, lambda: isinstance(pilot.app.screen, CardDetailScreen)
                           and pilot.app.screen.points is not None)

        assert snap_compare(make_app(source=source, db_path=db), terminal_size=size, run_before=detail)


class TestPools:
    @SIZES
    def test_rules_rows_shading_and_the_rules_of_a_free_cell(self, snap_compare, make_app, size):
        """Sunday: prod takes finetune until Monday 09:00; the cursor on card 3 after carol's booking."""
        async def free_prod_cell(pilot):
            await ready(pilot)
            await pilot.press("tab", "down", "down", "down", *["right"] * 5)

        assert snap_compare(make_app(config=DEMO), terminal_size=size, run_before=free_prod_cell)

    @SIZES
    def test_week_view_of_the_demo(self, snap_compare, make_app, tmp_path, size):
        """The demo's plan: bob's TP4 online service on weekdays 09:00-19:00, alice's finetune at night."""
        source = simulated()
        db = tmp_path / "demo.db"
        seed_demo(db, source)

        async def week(pilot):
            await ready(pilot)
            await pilot.press("z")
            app = pilot.app
            await wait_for(pilot, lambda: app.view.window_start == app.board.timeline.model.view_start)

        assert snap_compare(make_app(config=DEMO, source=source, db_path=db), terminal_size=size, run_before=week)


class TestLabels:
    @SIZES
    def test_long_labels_are_abbreviated_and_the_holder_column_stays(self, snap_compare, make_app, size):
        labels = {i: f"rack-A slot {i} SN-7731{i}" for i in range(8)}
        assert snap_compare(make_app(config=structs.replace(DEMO, labels=labels)), terminal_size=size, run_before=ready)


class TestFleet:
    @SIZES
    def test_two_hosts_one_down(self, snap_compare, make_app, second_host, size):
        """gpu1's board with gpu2's cards under their heading, HOST DOWN since gpu2's last heartbeat (15:28), its
        stale telemetry blanked, bob's booking on gpu2:4 kept."""
        second_host(down=True)
        assert snap_compare(make_app(config=GPU1), terminal_size=size, run_before=ready)


class TestStale:
    def test_database_unreachable_header(self, snap_compare, make_app):
        """The service's database unreachable since 15:28: the header says so beside SIMULATED, at 80x24 too; the
        bookings are as the service last read them."""
        from app.tui.messages import TelemetryRead
        from tests.tui.conftest import wait_for

        async def stale(pilot) -> None:
            await ready(pilot)
            app = pilot.app
            app.post_message(TelemetryRead(app.fleet, stale_since=app.clock() - 120))  # as the fleet event says it
            await wait_for(pilot, lambda: app.stale_since is not None)

        assert snap_compare(make_app(config=GPU1), terminal_size=(80, 24), run_before=stale)

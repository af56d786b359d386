"""The team catalog's on-demand servers on the board (docs/gateway.md#models-on-demand): the Servers screen says
"on demand" where the runner account holds the booking, and names the catalog alias and its project; the card rows
and the calendar show the on-demand booking as any booking, its holder with its project.

The booking is the one the service makes for a catalog entry (app.service.ops.models): the runner account's, with
`request = {"on_demand": alias}` and the entry's project; it is seeded here as the service would write it.
Update the snapshots with the whole TUI suite (see test_tui_snapshots) and look at them first.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from app.config import Config, Project
from app.gpu.simulated import demo_uid
from app.llama.rows import Server
from app.tui.messages import ServerLine, ServersLoaded, ServersView
from tests.conftest import FROZEN_NOW
from tests.tui.conftest import ready, seed, simulated, wait_for

RUNNER = "board-llama"
ON_DEMAND = 7  # the booking's id: after DAY's six
# The runner's on-demand booking for qwen-7b on card 6 since 15:15, its lease to 16:00, billed to project search.
LEASE = (RUNNER, (6,), 0.25, 0.75, "online", "on demand: qwen-7b")
PROJECTS = Config(projects=(Project("search", ("alice",), classes=("online", "finetune", "batch", "experiment")),))


@pytest.fixture
def on_demand_db(tmp_path) -> Path:
    db = tmp_path / "on-demand.db"
    seed(db, simulated(), extra=(LEASE,))
    conn = sqlite3.connect(db)
    with conn:
        found = conn.execute("UPDATE bookings SET request = ?, project = 'search' WHERE id = ? AND user = ?",
                             (json.dumps({"on_demand": "qwen-7b"}), ON_DEMAND, RUNNER)).rowcount
        assert found == 1
    conn.close()
    return db


def server(id_: int, booking: int, user: str, cards: tuple[int, ...], alias: str, state: str) -> Server:
    return Server(id=id_, booking_id=booking, user=user, uid=demo_uid(user), cards=cards,
                  card_uuids=tuple(f"GPU-{c}" for c in cards), model=f"/models/{alias}.gguf", alias=alias,
                  host="127.0.0.1", port=8100 + id_, ctx=4096, parallel=1, split_mode=None, metrics=False,
                  cmdline=(), log_path=f"/var/lib/board/servers/{id_}.log", state=state,
                  created_at=int(FROZEN_NOW) - 900, ready_at=int(FROZEN_NOW) - 840 if state == "ready" else None)


# The on-demand server first (the cursor's row, so the detail line is its), then alice's own on booking 1.
SERVERS = ServersView((ServerLine(server(3, ON_DEMAND, RUNNER, (6,), "qwen-7b", "ready"), None),
                       ServerLine(server(2, 1, "alice", (0, 1), "llama3-8b", "ready"), None)), FROZEN_NOW)


async def servers_screen(pilot) -> None:
    await ready(pilot)
    await pilot.press("s")
    await wait_for(pilot, lambda: type(pilot.app.screen).__name__ == "ServersScreen")
    pilot.app.post_message(ServersLoaded(SERVERS))
    await wait_for(pilot, lambda: pilot.app.screen.query_one(DataTable).row_count == 2)


class TestOnDemandServers:
    @pytest.mark.parametrize("size", [(120, 40)], ids=["120x40"])
    def test_the_servers_screen_marks_the_on_demand_server(self, snap_compare, make_app, on_demand_db, size):
        """qwen-7b reads 'on demand' in USER and its detail line names the alias and project; alice's as before."""
        assert snap_compare(make_app(config=PROJECTS, db_path=on_demand_db), terminal_size=size,
                            run_before=servers_screen)

    async def test_only_a_server_on_an_on_demand_booking_reads_on_demand(self, make_app, on_demand_db):
        """Wrong versions: every server marked (alice's too), none marked (the runner account shown: a stranger to
        the team), the mark taken from the server's alias or user rather than its booking (a server of the runner's
        on a booking with no on_demand: a planned server's is its holder's, so this is the booking's field or
        nothing), the detail line without the alias or the project."""
        app = make_app(config=PROJECTS, db_path=on_demand_db)
        async with app.run_test(size=(120, 40)) as pilot:
            await servers_screen(pilot)
            table = app.screen.query_one(DataTable)
            users = {key.value: str(table.get_row(key)[3]) for key in table.rows}
            assert users == {"3": "on demand", "2": "alice"}
            detail = app.screen.query_one("#detail", Static)
            assert str(detail.render()).startswith("on demand: qwen-7b for project search (board models) · booking #7")
            await pilot.press("down")  # alice's: no mark
            await wait_for(pilot, lambda: str(detail.render()).startswith("booking #1"))
            # the runner account's server on a booking that is not on demand (its request holds no alias)
            plain = ServerLine(server(4, 2, RUNNER, (2,), "qwen-7b", "starting"), None)
            app.post_message(ServersLoaded(ServersView((*SERVERS.lines, plain), FROZEN_NOW)))
            await wait_for(pilot, lambda: table.row_count == 3)
            assert str(table.get_row("4")[3]) == RUNNER


async def on_card_6(pilot) -> None:
    await ready(pilot)
    await pilot.press("tab", *["down"] * 6)  # the calendar, card 6, now: inside the on-demand booking


class TestOnDemandBookings:
    @pytest.mark.parametrize("size", [(120, 40)], ids=["120x40"])
    def test_the_card_row_and_the_calendar_show_the_runners_booking_with_its_project(self, snap_compare, make_app,
                                                                                      on_demand_db, size):
        """Card 6 held by the runner account until 16:00 in the card table (its project gives way to the holder's
        name there, as any long name's does), its block on the calendar, the line under it naming project search
        and the note 'on demand: qwen-7b', its row in the bookings list: as any booking."""
        assert snap_compare(make_app(config=PROJECTS, db_path=on_demand_db), terminal_size=size,
                            run_before=on_card_6)

    async def test_the_line_under_the_calendar_names_the_project_it_is_billed_to(self, make_app, on_demand_db):
        """Wrong versions: the project left out of the runner's booking's line (the team sees whose budget pays),
        or the booking not drawn at all (the runner account filtered out as a system user)."""
        app = make_app(config=PROJECTS, db_path=on_demand_db)
        async with app.run_test(size=(120, 40)) as pilot:
            await on_card_6(pilot)
            detail = app.board.query_one("#detail", Static)
            await wait_for(pilot, lambda: str(detail.render()).startswith("#7 "))
            assert str(detail.render()).startswith(f"#7 {RUNNER} · project search · card 6 · ")
            assert "on demand: qwen-7b" in str(detail.render())

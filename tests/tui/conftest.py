"""TUI fixtures: a frozen clock (UTC), the simulated fleet, a seeded database file and an app factory.

Everything a snapshot shows is fixed here: the time, the time zone, the host name, the
fleet and its bookings. Nothing reads the machine's hostname, clock or version.

The factory's board has its update threads off (`FedBoard`, as memray tests its TUI): `ready`
posts what they would post, read through the same client calls, so a test waits for nothing but
the app. `make_app(live=True)` keeps the real pollers, for the few end-to-end tests.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from msgspec import structs

from app.config import Config, FleetSettings
from app.core.identity import Identity
from app.gpu.simulated import DEFAULT_FLEET, Scenario, SimulatedSource, demo_uid
from app.demo import seed_if_empty
from app.store.db import connect
from app.tui.app import BoardApp
from app.tui.pollers import fleet_read, load_bookings
from tests.conftest import FROZEN_NOW

HOUR = 3600
BASE = FROZEN_NOW - FROZEN_NOW % HOUR  # 15:00 UTC, Sunday; now is 15:30

# The day most tests see (user, cards, start offset h from BASE, duration h, class, note), fixed here rather than
# taken from the demo, so the demo's plan can change: alice IN USE on 0,1, bob IN USE on 2, carol BOOKED idle
# on 3, dave SQUATTED on 5 (the simulated fleet's processes).
DAY = (
    ("alice", (0, 1), -2, 6, "finetune", "llama3-8b LoRA sweep"),
    ("bob", (2,), -20, 44, "online", "qwen2.5-14b chat endpoint"),
    ("carol", (3,), -1, 3, "experiment", "kv-cache quantisation tests"),
    ("erin", (7,), 2, 4, "batch", "nightly embeddings"),
    ("frank", (4, 5, 6, 7), 20, 10, "finetune", "70B full fine-tune, run 2"),
    ("alice", (0, 1), 30, 8, "batch", "eval harness"),
)

ALICE = Identity("alice", demo_uid("alice"), False)
ERIN_ADMIN = Identity("erin", demo_uid("erin"), True)

# Text other people control, as hostile as it gets: terminal escapes (CSI, OSC 8 links, OSC 52
# clipboard), Rich/Textual markup, bidi overrides and zero-width characters.
HOSTILE_USER = "m[bold red]al\x1b[31mlory\u202e"
HOSTILE_NOTE = (
    "\x1b]8;;http://evil.example/\x07click me\x1b]8;;\x07 [link=http://evil.example/]x[/link] "
    "[bold red]PWNED[/] \x1b]52;c;ZWNobyBoaQ==\x07 \u202egnp.exe\u202c zero\u200bwidth \x1b[2J"
)
HOSTILE_COMMAND = "python -c '[blink]x[/blink]' \x1b[1;31mred\x1b[0m \x1b]0;owned\x07 \u2066rtl\u2069"


@pytest.fixture(autouse=True)
def utc_clock():
    """Times on screen read the same on every machine."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


def frozen() -> float:
    return FROZEN_NOW


def simulated(scenario: Scenario = DEFAULT_FLEET, clock=frozen) -> SimulatedSource:
    return SimulatedSource(scenario, clock=clock)


def seed(db_path: Path, source: SimulatedSource, extra=()) -> None:
    """DAY at FROZEN_NOW, plus `extra` bookings of the same shape."""
    conn = connect(db_path)
    try:
        seed_if_empty(conn, source.read().cards, FROZEN_NOW, (*DAY, *extra))
    finally:
        conn.close()


def seed_demo(db_path: Path, source: SimulatedSource, now: float = FROZEN_NOW) -> None:
    """The database `board --demo` seeds (app.demo: prod's standing plan and the lab's bookings), at `now`."""
    conn = connect(db_path)
    try:
        seed_if_empty(conn, source.read().cards, now)
    finally:
        conn.close()


def hostile_scenario() -> Scenario:
    from app.gpu.model import GpuProcess

    process = GpuProcess(47001, 3000, HOSTILE_USER, 4242, HOSTILE_COMMAND)
    return replace(DEFAULT_FLEET, processes=(*DEFAULT_FLEET.processes, (4, process)))


@pytest.fixture
def seeded_db(tmp_path) -> Path:
    path = tmp_path / "board.db"
    seed(path, simulated())
    return path


class FedBoard(BoardApp):
    """The board with its update threads off: `feed` posts what they would, through the same client calls."""

    CSS_PATH = Path(sys.modules[BoardApp.__module__].__file__).with_name(BoardApp.CSS_PATH)  # Textual reads it beside the class

    def start_pollers(self) -> None:
        pass  # nothing polls: the test feeds

    def reload_bookings(self) -> None:
        # The loader's one round (app.tui.pollers), at once, on the caller's thread: the UI's when the timeline
        # moves, the backend's after a write.
        load_bookings(self, self.client, self.clock, *self.window)

    def feed(self) -> None:
        """What the pollers post first: the fleet (the service's `fleet` event) with its recorded history, then the
        bookings and the alerts."""
        from app.service.box.watch import fleet_event

        self.post_message(fleet_read(self.client, fleet_event(self.client.service), self.history_step))
        self.reload_bookings()


@pytest.fixture
def make_app(seeded_db):
    """make_app(identity=ALICE, source=None, clock=frozen, config=None, db_path=None, live=False) -> a board on the
    seeded database: a FedBoard, or with live=True a BoardApp whose pollers run."""
    from app.client.local import LocalClient

    def make(identity: Identity = ALICE, source=None, clock=frozen, config: Config | None = None, db_path=None,
             live: bool = False):
        config = structs.replace(config or Config(), db_path=db_path or seeded_db)
        if not live:  # telemetry comes when the test posts it: an hour's refresh keeps the board from calling it stalled
            config = structs.replace(config, refresh_seconds=3600.0)
        return (BoardApp if live else FedBoard)(
            LocalClient.on(config, source or simulated(clock=clock), identity, clock=clock),
            identity=identity,
            config=config,
            clock=clock,
            host="gpu-box",
            history_step=5.0,
        )

    return make


async def wait_for(pilot, condition, timeout: float = 5.0, step: float = 0.02) -> None:
    """Let the app run until condition() holds; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {condition}")
        await pilot.pause(step)


async def settle(pilot, timeout: float = 5.0) -> None:
    """Let the app run until two screenshots 0.1 s apart are the same and every table on the screen has measured its
    rows: whatever a message or timer still had to draw has been drawn. Fails after `timeout` seconds of a screen
    that keeps changing."""
    deadline = time.monotonic() + timeout
    # A screenshot counts as the first of two only once the tables have measured: the redraw their measuring asks
    # for then shows as a change.
    before = pilot.app.export_screenshot() if measured(pilot.app) else None
    while True:
        await pilot.pause(0.1)
        ready = measured(pilot.app)
        after = pilot.app.export_screenshot()
        if ready and after == before:
            return
        after = after if ready else None
        if time.monotonic() > deadline:
            raise AssertionError(f"the screen still changed after {timeout} s")
        before = after


def measured(app) -> bool:
    """Every DataTable on the screen has sized its columns to its rows. A table does that in its idle pass, after its
    rows are added: a screenshot before it is not the screen's last. (The admin screen's audit log shot with its
    columns as narrow as their labels was the app's: see app/tui/widgets/table.py.) The flags are the table's own: no
    public API says."""
    from textual.widgets import DataTable

    return not any(table._require_update_dimensions or table._updated_cells for table in app.screen.query(DataTable))


def steady_cursors(app) -> None:
    """Stop the inputs' cursors blinking, shown: a blink is a race in a picture (pytest-textual-snapshot's advice)."""
    from textual.widgets import Input

    for field in app.screen.query(Input):
        field.cursor_blink = False


@pytest.fixture
def snap_compare(snap_compare):
    """pytest-textual-snapshot's snap_compare, taking its picture only once the cursors are steady and the screen
    has settled (settle)."""

    def compare(app, *, run_before=None, **kwargs) -> bool:
        async def then_settle(pilot) -> None:
            if run_before is not None:
                await run_before(pilot)
            steady_cursors(pilot.app)
            await settle(pilot)

        return snap_compare(app, run_before=then_settle, **kwargs)

    return compare


async def ready(pilot) -> None:
    """The first telemetry and the first bookings have arrived (posted here to a FedBoard) and been drawn."""
    app = pilot.app
    if hasattr(app, "feed"):  # a FedBoard (not isinstance: pytest also imports this file as plain `conftest`)
        app.feed()
    await wait_for(pilot, lambda: app.fleet is not None and app.view is not None)
    await pilot.pause()


# -- two hosts on one database --------------------------------------------------------------------------------

GPU1 = Config(fleet=FleetSettings(host="gpu1", heartbeat_timeout_s=30.0))  # the board's host
BOB = Identity("bob", demo_uid("bob"), False)


@pytest.fixture
def second_host(seeded_db, tmp_path):
    """second_host(down=False) -> gpu2's service on the seeded database (its own simulated cards and history file),
    its heartbeat written: at FROZEN_NOW (up, for a board on GPU1 at FROZEN_NOW), or two minutes before, past the
    30 s timeout (HOST DOWN since 15:28). Bob holds gpu2's card 4 from 15:30 for 4 h."""
    from app.client.local import LocalClient
    from app.config import HistorySettings
    from app.gpu import open_source
    from app.service.fleet.hosts import beat
    from tests.conftest import Clock

    from app.store.hosts import claim_cards

    conn = connect(seeded_db)
    claim_cards(conn, "gpu1")  # the seeded cards are gpu1's (its agent's first heartbeat claims them)
    conn.close()
    made = []

    def make(down: bool = False):
        clock = Clock(FROZEN_NOW - 120 if down else FROZEN_NOW)
        config = structs.replace(GPU1, db_path=seeded_db, history=HistorySettings(db=str(tmp_path / "gpu2.history.db")),
                         fleet=structs.replace(GPU1.fleet, host="gpu2"))
        client = LocalClient.on(config, open_source(True, clock=clock, host="gpu2"), BOB, clock=clock)
        made.append(client)
        beat(client.service)
        client.call("book", cards=[4], start=int(FROZEN_NOW), end=int(FROZEN_NOW) + 4 * HOUR, note="on gpu2")
        return client

    yield make
    for client in made:
        client.service.close()

"""Write the README's screenshots (screenshots/*.svg) from the simulated fleet: `make screenshots`.

Everything is fixed: the clock (Sunday 2026-11-29 15:30 UTC), the time zone, the host name,
the fleet and the demo bookings, so the files change only when the board's looks do.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ["TZ"] = "UTC"
time.tzset()

from app.config import Config, Project, ProjectAllocation  # noqa: E402
from app.core.identity import Identity  # noqa: E402
from app.demo import demo_config, seed_if_empty  # noqa: E402
from app.gpu.simulated import SimulatedSource  # noqa: E402
from app.store.db import connect  # noqa: E402
from app.client.local import LocalClient  # noqa: E402
from app.tui.app import BoardApp  # noqa: E402
from textual.widgets import Input  # noqa: E402

NOW = 1795966200
OUT = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "screenshots"  # tests write to a scratch folder


def frozen() -> float:
    return NOW


def settled(app) -> bool:
    """The bookings shown are those of the timeline's current window (a zoom or scroll reloads them)."""
    timeline = app.board.timeline.model
    return app.view is not None and (app.view.window_start, app.view.window_end) == (timeline.view_start,
                                                                                      timeline.view_end)


# The two kinds of work as projects: the business group holds prod 09-19 on weekdays for its online service,
# research holds lab's cards 6-7 overnight; each demo booking is its holder's project's.
PROJECTS = (
    Project("business", ("bob",), classes=("online", "batch"), gpu_hours=400.0,
            allocations=(ProjectAllocation(pool="prod", hours="09:00-19:00", days="mon-fri"),)),
    Project("research", ("alice", "carol", "dave", "erin", "frank"), classes=("batch", "finetune", "experiment"),
            gpu_hours=600.0, allocations=(ProjectAllocation(cards=(6, 7), hours="20:00-08:00"),)),
)


async def shoot(name: str, keys: tuple[str, ...], size: tuple[int, int], until=None,
                projects: tuple[Project, ...] = ()) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "board.db"
        source = SimulatedSource(clock=frozen)
        conn = connect(db)
        seed_if_empty(conn, source.read().cards, now=NOW)
        with conn:
            for project in projects:
                for member in project.members:
                    conn.execute("UPDATE bookings SET project = ? WHERE user = ?", (project.name, member))
        conn.close()
        alice, config = Identity("alice", 2000, False), demo_config(Config(db_path=db, projects=projects))
        app = BoardApp(LocalClient.on(config, source, alice, clock=frozen), identity=alice, config=config,
                       clock=frozen, host="gpu-box", history_step=5.0)
        async with app.run_test(size=size) as pilot:
            deadline = time.monotonic() + 10
            while (app.fleet is None or app.view is None) and time.monotonic() < deadline:
                await pilot.pause(0.05)
            await pilot.pause()
            await pilot.press(*keys)
            while not (settled(app) and (until is None or until(app))) and time.monotonic() < deadline:
                await pilot.pause(0.05)
            for field in app.screen.query(Input):  # a blink is a race in a picture: the cursor shows, steady
                field.cursor_blink = False
            await pilot.pause(0.3)
            path = OUT / f"{name}.svg"
            title = "board" if name == "board" else f"board · {name.replace('-', ' ')}"
            path.write_text(app.export_screenshot(title=title))
            print(path)


async def main() -> None:
    OUT.mkdir(exist_ok=True)
    from app.tui.screens.booking_form import BookingModal
    from app.tui.screens.card_detail import CardDetailScreen

    await shoot("board", (), (120, 40))
    await shoot("board-80x24", (), (80, 24))
    await shoot("timeline-week", ("tab", "z"), (120, 40))
    # A keyboard selection on the timeline (lab cards 5-6, 16:30-18:30), then b: the form, filled in and valid.
    await shoot("booking-form", ("tab", "down", "down", "down", "down", "down", "right", "right", "shift+down",
                                 "shift+right", "shift+right", "shift+right", "b"), (120, 40),
                until=lambda app: isinstance(app.screen, BookingModal) and "✓" in str(
                    app.screen.query_one("#message").render()))
    await shoot("card-detail", ("enter",), (120, 40),
                until=lambda app: isinstance(app.screen, CardDetailScreen) and app.screen.points is not None)
    await shoot("board-projects", (), (120, 40), projects=PROJECTS)


if __name__ == "__main__":
    asyncio.run(main())

"""`board` alone, from its command line to its first paint: what it loads and builds on the way (issue 37).

Structural facts only, never a time: the first screen waits for no parser of the other commands, no model
sizing, no form; those load when first used.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

# Runs `app.cli.main([])` in file mode on the simulated fleet, with BoardApp.run swapped for a headless run that
# ends at the first paint of the fleet (the card table's rows), then prints what was loaded and built.
FIRST_PAINT = """
import asyncio, json, os, sys
os.environ.update(BOARD_DB={db!r}, BOARD_SIMULATE="1", XDG_STATE_HOME={tmp!r}, HOME={tmp!r}, TZ="UTC")
import app.cli
from app.tui.app import BoardApp

built = []
real_build_parser = app.cli.build_parser
app.cli.build_parser = lambda: built.append("parser") or real_build_parser()
rows, widgets = [], []

async def first_paint(board):
    async with board.run_test(size=(80, 24)) as pilot:
        painted = asyncio.Event()
        board.fleet_signal.subscribe(board.board, lambda snapshot: painted.set())
        await asyncio.wait_for(painted.wait(), 60)
        await pilot.pause()
        rows.append(board.board.card_table.row_count)
        widgets.extend(sorted({{type(node).__name__ for node in board.screen.walk_children()}}))
    return 0

BoardApp.run = lambda board: asyncio.run(first_paint(board))
code = app.cli.main([])
print(json.dumps({{"code": code, "built": built, "rows": rows, "widgets": widgets, "modules": sorted(sys.modules)}}))
"""


def first_paint(tmp_path) -> dict:
    code = FIRST_PAINT.format(db=str(tmp_path / "board.db"), tmp=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_board_alone_paints_its_first_screen_without_the_other_commands_or_the_forms(tmp_path):
    """Wrong versions this fails on: `board` alone parsed by the full parser again (every command's module and
    app.fit with it); the booking form or the model sizing imported at the board's start rather than when first
    opened; the upcoming table (hidden below 34 rows) built at 80x24."""
    start = first_paint(tmp_path)
    assert start["code"] == 0 and start["rows"] == [8]  # it did paint: the simulated fleet's eight cards
    assert start["built"] == []
    loaded = set(start["modules"])
    parser_only = {"app.cli.admin", "app.cli.agent", "app.cli.serve", "app.cli.gateway", "app.cli.report"}
    assert not loaded & parser_only
    later = {"app.fit.estimate", "app.fit.gguf_model", "app.tui.screens.booking_form", "app.tui.screens.servers",
             "app.tui.screens.my_bookings", "app.tui.screens.admin", "app.tui.screens.card_detail"}
    assert not loaded & later, loaded & later
    assert "UpcomingTable" not in start["widgets"] and "CardTable" in start["widgets"]  # shown on a tall board only

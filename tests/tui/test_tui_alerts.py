"""The board's header shows the service's firing alerts: the newest, how many more, inert; another user's
per-user alert never."""

from __future__ import annotations

import sqlite3

from app.tui.widgets.header import BoardHeader
from tests.tui.conftest import FROZEN_NOW, ready, wait_for


def add_alerts(db_path, *rows) -> None:
    conn = sqlite3.connect(db_path)
    with conn:
        for rule, subject, message, uid, fired in rows:
            conn.execute("INSERT INTO alerts (rule, subject, state, fired_at, last_seen, message, uid)"
                         " VALUES (?, ?, 'firing', ?, ?, ?, ?)", (rule, subject, fired, fired, message, uid))
    conn.close()


async def test_the_header_shows_the_alerts(make_app, seeded_db):
    add_alerts(seeded_db, ("hot", "GPU-7", "GPU 7 at 93 °C (at or over 92 °C)", None, FROZEN_NOW - 600),
               ("squatter", "GPU-5", "GPU 5 squatted by \x1b[2Jeve (not booked)", None, FROZEN_NOW - 60),
               ("ending", "booking:9", "your booking 9 ends in 5 min", 4242, FROZEN_NOW))  # someone else's
    app = make_app()
    async with app.run_test(size=(200, 30)) as pilot:
        await ready(pilot)
        header = app.board.query_one(BoardHeader)
        await wait_for(pilot, lambda: header.alerts)
        assert header.alerts == "⚠ GPU 5 squatted by \x1b[2Jeve (not booked) (+1 more: board alerts)"
        rendered = header.render().plain
        assert "\\x1b[2Jeve" in rendered and "\x1b" not in rendered


async def test_no_alerts_no_line(make_app):
    app = make_app()
    async with app.run_test(size=(200, 30)) as pilot:
        await ready(pilot)
        await pilot.pause(0.2)
        assert app.board.query_one(BoardHeader).alerts == ""

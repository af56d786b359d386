"""The Servers screen shows the planned servers (board serve plan) and their next start."""

from __future__ import annotations

import time

from app.tui.messages import ServersLoaded, ServersView
from tests.tui.conftest import ready, wait_for


class TestPlannedServers:
    async def test_the_servers_screen_shows_each_planned_servers_next_start(self, make_app):
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            app.action_servers()
            await wait_for(pilot, lambda: type(app.screen).__name__ == "ServersScreen" and app.screen.query("#planned"))
            planned = app.screen.query_one("#planned")
            app.post_message(ServersLoaded(ServersView((), time.time())))
            await pilot.pause()
            assert not planned.display  # nothing planned: no line
            start = time.mktime((2026, 12, 7, 9, 0, 0, 0, 0, -1))  # a Monday, 09:00 local
            plan = {"id": 1, "booking": None, "series": 7, "user": "alice", "alias": "team\x1b[31m", "model": "/m/q.gguf",
                    "ctx": None, "parallel": None, "created": 0, "cancelled": None, "next_start": start,
                    "next_booking": 42}
            app.post_message(ServersLoaded(ServersView((), time.time(), planned=(plan,))))
            await wait_for(pilot, lambda: planned.display)
            text = planned.render().plain
            assert text == "planned: team\\x1b[31m (alice) from Mon 09:00, booking 42", text

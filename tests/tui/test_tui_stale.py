"""The board while its service's PostgreSQL database is unreachable (the throwaway cluster paused, tests/postgres.py):
the fleet event carries the stale marker, the header shows `DB UNREACHABLE since HH:MM`, the bookings stay as last
read, and the marker goes once the database is back (issue 21, §2)."""

from __future__ import annotations

import time

import pytest
from msgspec import structs

from app.tui.widgets.header import BoardHeader
from tests.tui.conftest import GPU1, ready, wait_for

pytestmark = pytest.mark.asyncio


def _header(app) -> str:
    return str(app.board.query_one(BoardHeader).render())


async def test_the_header_says_since_when_the_database_is_unreachable_and_clears_when_it_is_back(make_app,
                                                                                                pg_cluster):
    url = pg_cluster.fresh_database()
    app = make_app(config=structs.replace(GPU1, storage_url=url))
    now = int(app.clock())
    made = app.client.call("book", cards=[2], start=now, end=now + 3600, note="before")
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)  # the fleet and the bookings read: what the service remembers
        assert "UNREACHABLE" not in _header(app)
        pg_cluster.pause()
        try:
            app.feed()  # the service's next fleet event and window read (app.tui.pollers)
            await wait_for(pilot, lambda: app.stale_since is not None)
            assert "DB UNREACHABLE since 15:30" in _header(app)  # the frozen clock's read
            assert [b.id for b in app.view.upcoming] == [made["id"]]  # the bookings as last read
            assert app.alert == ""  # not the service down, nor telemetry failed
        finally:
            pg_cluster.resume()
        deadline = time.monotonic() + 90  # the service's connection retries after its backoff (at most 30 s)
        while app.stale_since is not None:
            assert time.monotonic() < deadline, "the marker stayed"
            app.feed()
            await pilot.pause(0.5)
        await pilot.pause()
        assert "UNREACHABLE" not in _header(app)

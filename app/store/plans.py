"""Planned servers (a server spec attached to a booking or a series), for the gateway's view.

The runner's half of issue 20 implements this module; until then there are none.
"""

from __future__ import annotations

import sqlite3


def planned_servers(conn: sqlite3.Connection, now: int) -> list[dict]:
    """The planned servers not yet up whose booking has not ended, as
    [{"alias", "booking", "start", "end", "user"}] (times in epoch seconds), soonest first."""
    return []

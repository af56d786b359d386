"""The fleet's hosts: each host's service writes its heartbeat and its latest snapshot here, and reads the others'.

A row per host (host, seen_at, started_at, snapshot): `snapshot` is app.gpu.model.snapshot_to_wire's JSON.
The SQL only; what a late heartbeat means (HOST DOWN) is app.service.fleet's.
"""

from __future__ import annotations

import sqlite3
from typing import NamedTuple


class HostRow(NamedTuple):
    host: str
    seen_at: float
    started_at: float
    snapshot: str  # JSON


def beat(conn: sqlite3.Connection, host: str, now: float, started_at: float, snapshot: str) -> None:
    """This host's heartbeat and snapshot. Call inside a write transaction."""
    conn.execute(
        "INSERT INTO hosts (host, seen_at, started_at, snapshot) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (host) DO UPDATE SET seen_at = excluded.seen_at, started_at = excluded.started_at,"
        " snapshot = excluded.snapshot",
        (host, now, started_at, snapshot),
    )


def all_hosts(conn: sqlite3.Connection) -> list[HostRow]:
    """Every host that has ever beaten, by name."""
    return [HostRow(*row) for row in conn.execute(
        "SELECT host, seen_at, started_at, snapshot FROM hosts ORDER BY host")]


def one(conn: sqlite3.Connection, host: str) -> HostRow | None:
    row = conn.execute("SELECT host, seen_at, started_at, snapshot FROM hosts WHERE host = ?", (host,)).fetchone()
    return HostRow(*row) if row else None


def claim_cards(conn: sqlite3.Connection, host: str) -> None:
    """Cards recorded before the fleet (host '') are this host's: a one-host board's database becomes its first
    host's. Reads first, so that it writes (in its own transaction) only once."""
    if conn.execute("SELECT 1 FROM cards WHERE host = '' LIMIT 1").fetchone() is None:
        return
    from app.store.db import write  # start-up: a claim is made once per database

    with write(conn):
        conn.execute("UPDATE cards SET host = ? WHERE host = ''", (host,))
    if (calendar := getattr(conn, "calendar", None)) is not None:
        calendar.stale = True

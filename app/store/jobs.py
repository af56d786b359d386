"""The jobs the service holds pidfds for: the SQL, so that a restarted service adopts them again."""

from __future__ import annotations

import json
import sqlite3


def remember(conn: sqlite3.Connection, *, pid: int, started_ticks: int, booking_id: int, uid: int, pgid: int,
             cards: tuple[str, ...], now: int, host: str) -> None:
    """A job on `host` (this service's [fleet] host: in a fleet each host's service registers its own)."""
    conn.execute(
        "INSERT INTO jobs (pid, started_ticks, booking_id, uid, pgid, cards, registered_at, host)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (pid, started_ticks) DO UPDATE SET booking_id = excluded.booking_id,"
        " uid = excluded.uid, pgid = excluded.pgid, cards = excluded.cards, registered_at = excluded.registered_at",
        (pid, started_ticks, booking_id, uid, pgid, json.dumps(list(cards)), now, host),
    )


def forget(conn: sqlite3.Connection, pid: int, started_ticks: int) -> None:
    conn.execute("DELETE FROM jobs WHERE pid = ? AND started_ticks = ?", (pid, started_ticks))


def remembered(conn: sqlite3.Connection, host: str) -> list[dict]:
    """The jobs of `host` (and those recorded before the fleet): another host's pids mean nothing here."""
    rows = conn.execute("SELECT pid, started_ticks, booking_id, uid, pgid, cards FROM jobs WHERE host IN (?, '')",
                        (host,)).fetchall()
    return [{"pid": r[0], "started_ticks": r[1], "booking_id": r[2], "uid": r[3], "pgid": r[4],
             "cards": tuple(json.loads(r[5]))} for r in rows]

"""The jobs the service holds pidfds for: the SQL, so that a restarted service adopts them again."""

from __future__ import annotations

import json
import sqlite3


def remember(conn: sqlite3.Connection, *, pid: int, started_ticks: int, booking_id: int, uid: int, pgid: int,
             cards: tuple[str, ...], now: int) -> None:
    conn.execute(
        "INSERT INTO jobs (pid, started_ticks, booking_id, uid, pgid, cards, registered_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (pid, started_ticks) DO UPDATE SET booking_id = excluded.booking_id,"
        " uid = excluded.uid, pgid = excluded.pgid, cards = excluded.cards, registered_at = excluded.registered_at",
        (pid, started_ticks, booking_id, uid, pgid, json.dumps(list(cards)), now),
    )


def forget(conn: sqlite3.Connection, pid: int, started_ticks: int) -> None:
    conn.execute("DELETE FROM jobs WHERE pid = ? AND started_ticks = ?", (pid, started_ticks))


def remembered(conn: sqlite3.Connection) -> list[dict]:
    rows = conn.execute("SELECT pid, started_ticks, booking_id, uid, pgid, cards FROM jobs").fetchall()
    return [{"pid": r[0], "started_ticks": r[1], "booking_id": r[2], "uid": r[3], "pgid": r[4],
             "cards": tuple(json.loads(r[5]))} for r in rows]

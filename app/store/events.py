"""The audit log: every change and every refused attempt, append-only and hash-chained.

Each row's hash covers its own fields and the previous row's hash, so an edit or a deletion
made by hand shows up as the first row whose hash no longer matches (board doctor checks it).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from app.model import Event
from app.store.db import lock_chain

GENESIS = "0" * 64
_TAIL = "SELECT hash FROM events ORDER BY id DESC LIMIT 1"


def record(
    conn: sqlite3.Connection,
    *,
    ts: int,
    uid: int,
    actor: str,
    action: str,
    booking_id: int | None,
    ok: bool,
    details: dict[str, Any] | None = None,
) -> None:
    """Append one event. Call inside a write transaction, so the chain's tail cannot move underneath."""
    # A PostgreSQL write on named cards holds the chain only from here to its commit: the lock and the tail's read
    # go in one round trip.
    rows = lock_chain(conn, then=_TAIL)
    if rows is None:
        rows = conn.execute(_TAIL).fetchall()
    prev_hash = rows[0][0] if rows else GENESIS
    if (host := getattr(conn, "fleet_host", None)) is not None:  # the host whose service vouched for the actor
        details = {**(details or {}), "host": host}
    body = json.dumps(details or {}, sort_keys=True, ensure_ascii=False)
    digest = _digest(prev_hash, ts, uid, actor, action, booking_id, ok, body)
    conn.execute(
        "INSERT INTO events (ts, uid, actor, action, booking_id, ok, details, prev_hash, hash)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (ts, uid, actor, action, booking_id, int(ok), body, prev_hash, digest),
    )


def recent(conn: sqlite3.Connection, limit: int = 100, booking_id: int | None = None) -> list[Event]:
    where, args = ("WHERE booking_id = ?", [booking_id]) if booking_id is not None else ("", [])
    rows = conn.execute(
        f"SELECT id, ts, uid, actor, action, booking_id, ok, details FROM events {where}"
        " ORDER BY id DESC LIMIT ?",
        [*args, limit],
    ).fetchall()
    return [Event(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), json.loads(r[7])) for r in rows]


def tail(conn: sqlite3.Connection) -> int:
    """The last event's id (0 when none): it moves with every audited change, so with every change to a booking."""
    return conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]


def first_broken(conn: sqlite3.Connection) -> int | None:
    """The id of the first event that was altered or removed by hand, or None when the chain is whole.

    A row whose hash does not cover its own fields was edited: that row. A row whose link does not
    match the row before it, though its own hash is consistent, follows removed rows (its id skips
    ahead: the first missing id) or follows a row that was edited and given a recomputed hash (that
    row). Removing rows from the end, or recomputing every later hash too, is not visible here;
    see docs/threat-model.md.
    """
    prev_hash, prev_id = GENESIS, None
    rows = conn.execute(
        "SELECT id, ts, uid, actor, action, booking_id, ok, details, prev_hash, hash FROM events ORDER BY id"
    )
    for id_, ts, uid, actor, action, booking_id, ok, details, stored_prev, stored_hash in rows:
        if stored_prev != prev_hash:
            if prev_id is None or id_ != prev_id + 1:
                return 1 if prev_id is None else prev_id + 1
            own = _digest(stored_prev, ts, uid, actor, action, booking_id, bool(ok), details)
            return prev_id if stored_hash == own else id_
        if stored_hash != _digest(prev_hash, ts, uid, actor, action, booking_id, bool(ok), details):
            return id_
        prev_hash, prev_id = stored_hash, id_
    return None


def _digest(prev_hash: str, ts, uid, actor, action, booking_id, ok: bool, details: str) -> str:
    import hashlib  # only writers and doctor need it; keeps read-only commands quick

    fields = json.dumps([prev_hash, ts, uid, actor, action, booking_id, int(ok), details], ensure_ascii=False)
    return hashlib.sha256(fields.encode("utf-8", "surrogatepass")).hexdigest()

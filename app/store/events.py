"""The audit log: every change and every refused attempt, append-only and hash-chained.

Each row's hash covers its own fields and the previous row's hash, so an edit or a deletion
made by hand shows up as the first row whose hash no longer matches (board doctor checks it).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from app.model import Event
from app.store.db import chain_lock, is_postgres

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
    if (host := getattr(conn, "fleet_host", None)) is not None:  # the host whose service vouched for the actor
        details = {**(details or {}), "host": host}
    body = json.dumps(details or {}, sort_keys=True, ensure_ascii=False)
    if is_postgres(conn) and conn.in_transaction:
        _append_pg(conn, (ts, uid, actor, action, booking_id, ok, body))
        return
    rows = conn.execute(_TAIL).fetchall()
    prev_hash = rows[0][0] if rows else GENESIS
    digest = _digest(prev_hash, ts, uid, actor, action, booking_id, ok, body)
    conn.execute(
        "INSERT INTO events (ts, uid, actor, action, booking_id, ok, details, prev_hash, hash)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (ts, uid, actor, action, booking_id, int(ok), body, prev_hash, digest),
    )


# The append on PostgreSQL: the tail is read, and the hash made (as _digest makes it: the fields after the previous
# hash come as _digest's JSON, made here), by the statement that inserts, sent with the write's COMMIT.
APPEND_PG = (
    "INSERT INTO events (ts, uid, actor, action, booking_id, ok, details, prev_hash, hash)"
    " SELECT ?, ?, ?, ?, ?, ?, ?, t.prev, " + "encode(sha256(convert_to('[' || to_json(t.prev)::text || ', ' || ? || ']',"
    " 'UTF8')), 'hex') FROM (SELECT coalesce((" + _TAIL + f"), '{GENESIS}') AS prev) AS t"
)


def _append_pg(conn, fields: tuple) -> None:
    """Defer (PgConnection.defer) the chain's lock, when this write takes it here (app.store.db.chain_lock), and the
    append after it: a statement of its own, so that its tail is read after the lock, as the latest one committed."""
    ts, uid, actor, action, booking_id, ok, body = fields
    if (lock := chain_lock(conn)) is not None:
        conn.defer(lock)
    conn.defer(APPEND_PG, (ts, uid, actor, action, booking_id, int(ok), body,
                           _fields_json(ts, uid, actor, action, booking_id, ok, body)))


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
    """The hash of an event: of the JSON list of the previous hash and its fields (APPEND_PG makes the same on
    PostgreSQL, from _fields_json)."""
    import hashlib  # only writers and doctor need it; keeps read-only commands quick

    fields = json.dumps([prev_hash], ensure_ascii=False)[:-1] + ", " + _fields_json(ts, uid, actor, action, booking_id,
                                                                                     ok, details) + "]"
    return hashlib.sha256(fields.encode("utf-8", "surrogatepass")).hexdigest()


def _fields_json(ts, uid, actor, action, booking_id, ok: bool, details: str) -> str:
    """An event's fields as the hashed JSON list holds them after the previous hash, without the brackets."""
    return json.dumps([ts, uid, actor, action, booking_id, int(ok), details], ensure_ascii=False)[1:-1]

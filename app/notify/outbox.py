"""The outbox table (schema v6): pushes waiting to be sent, with their attempts, so a restart loses nothing.

One row per message and target, sent in order per target. A row is `pending` until a 2xx answer (`sent`) or until it runs out
of attempts or meets a refusal that retrying cannot cure (`failed`); both are kept KEEP_S, then pruned.
`last_error` is written by app.notify.deliver, which keeps the target's url out of it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from app.config import NotifySettings
from app.notify.formats import Message
from app.store.db import write

KEEP_S = 2 * 86400  # sent and failed rows, for `board notify status` and the summary's once-per-slot key
BACKOFF_S = 30  # after the first failure; doubles each time
BACKOFF_MAX_S = 3600


@dataclass(frozen=True, slots=True)
class Row:
    id: int
    target: str
    kind: str
    message: Message
    state: str
    attempts: int
    max_attempts: int
    next_at: int
    last_status: int | None
    last_error: str | None


def enqueue(conn: sqlite3.Connection, settings: NotifySettings, message: Message, *, now: int,
            key: str | None = None, targets: tuple[str, ...] | None = None, max_attempts: int | None = None) -> list[int]:
    """Queue `message` for every target (or the named ones); returns the new rows' ids.

    Joins the caller's transaction if one is open (an alert and its push commit together), else
    writes in its own. With a `key`, a second enqueue of the same key to the same target is a no-op.
    """
    chosen = [t for t in settings.targets if targets is None or t.name in targets]
    attempts = max_attempts or settings.max_attempts
    if not conn.in_transaction:
        with write(conn):
            return _insert(conn, chosen, message, now, key, attempts)
    return _insert(conn, chosen, message, now, key, attempts)


def _insert(conn, chosen, message: Message, now: int, key: str | None, attempts: int) -> list[int]:
    ids = []
    for target in chosen:
        cursor = conn.execute(
            "INSERT INTO outbox (target, kind, key, message, created_at, max_attempts, next_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (target.name, message.kind, key, message.to_json(), now, attempts, now))
        if cursor.rowcount:
            ids.append(cursor.lastrowid)
    return ids


# A target's pushes go in order (an alert's "resolved" never before its "firing"): only its oldest pending row
# may be sent, and the rest wait while it backs off. Tests skip the line: an admin is waiting on them.
_HEADS = """
    FROM outbox AS o WHERE state = 'pending' AND (kind = 'test' OR NOT EXISTS (
        SELECT 1 FROM outbox AS e WHERE e.state = 'pending' AND e.target = o.target AND e.kind != 'test' AND e.id < o.id))
"""


def due(conn: sqlite3.Connection, now: int, limit: int = 20) -> list[Row]:
    """The rows to send now: each target's oldest pending row whose time has come, and tests; tests first."""
    return [_row(r) for r in conn.execute(
        f"SELECT * {_HEADS} AND next_at <= ? ORDER BY kind != 'test', id LIMIT ?", (now, limit))]


def next_due(conn: sqlite3.Connection) -> int | None:
    """When the next row may be sent (None: nothing pending)."""
    return conn.execute(f"SELECT min(next_at) {_HEADS}").fetchone()[0]


def rows(conn: sqlite3.Connection, ids: list[int]) -> list[Row]:
    if not ids:  # PostgreSQL has no empty IN ()
        return []
    marks = ",".join("?" * len(ids))
    return [_row(r) for r in conn.execute(f"SELECT * FROM outbox WHERE id IN ({marks}) ORDER BY id", ids)]


def record(conn: sqlite3.Connection, row: Row, *, now: int, status: int | None, error: str | None,
           retry: bool) -> None:
    """One attempt's outcome: sent (no error), retried later with backoff, or given up."""
    attempts = row.attempts + 1
    if error is None:
        state, next_at = "sent", row.next_at
    elif retry and attempts < row.max_attempts:
        state, next_at = "pending", now + backoff(attempts)
    else:
        state, next_at = "failed", row.next_at
    with write(conn):
        conn.execute("UPDATE outbox SET state = ?, attempts = ?, next_at = ?, last_status = ?, last_error = ?,"
                     " done_at = ? WHERE id = ?",
                     (state, attempts, next_at, status, error, None if state == "pending" else now, row.id))


def backoff(attempts: int) -> int:
    """Seconds to wait after the `attempts`-th failure: 30, 60, 120 ... up to an hour."""
    return min(BACKOFF_S * 2 ** (attempts - 1), BACKOFF_MAX_S)


def prune(conn: sqlite3.Connection, now: int) -> int:
    with write(conn):
        return conn.execute("DELETE FROM outbox WHERE state != 'pending' AND done_at < ?", (now - KEEP_S,)).rowcount


def _row(r) -> Row:
    (id, target, kind, _key, message, _created, state, attempts, max_attempts, next_at, last_status, last_error,
     _done) = r
    return Row(id, target, kind, Message.from_json(message), state, attempts, max_attempts, next_at, last_status,
               last_error)

"""The `faults` table (schema v7): one row per Xid event, OOM exit or thermal throttling spell.

`record` is called inside the caller's write transaction (app.store.db.write); `count` and `recent` only read.
The report and the alerts read this table through these functions.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import asdict, dataclass

KINDS = ("xid", "oom", "throttle", "build")  # build: a llama-server built without the cards' architecture


@dataclass(frozen=True, slots=True)
class Fault:
    id: int
    ts: int  # epoch seconds: when it happened (a throttling spell: when it began)
    card_uuid: str | None
    kind: str  # one of KINDS
    code: int | None  # the Xid code; None for the others
    detail: str  # the Xid's meaning, the OOM's log line, the throttle reasons
    duration_s: float | None  # throttling: how long it lasted
    booking_id: int | None
    user: str | None

    def to_json(self) -> dict:
        return asdict(self)


_COLUMNS = 'id, ts, card_uuid, kind, code, detail, duration_s, booking_id, "user"'


def record(conn: sqlite3.Connection, *, ts: float, kind: str, card_uuid: str | None = None, code: int | None = None,
           detail: str = "", duration_s: float | None = None, booking_id: int | None = None,
           user: str | None = None) -> int:
    """Add one fault; its id. Call inside a write transaction."""
    if kind not in KINDS:
        raise ValueError(f"fault kind must be one of {', '.join(KINDS)}, not {kind!r}")
    cursor = conn.execute(
        'INSERT INTO faults (ts, card_uuid, kind, code, detail, duration_s, booking_id, "user")'
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (int(ts), card_uuid, kind, code, detail[:500], duration_s, booking_id, user),
    )
    assert cursor.lastrowid is not None  # an INSERT that ran numbers its row
    return cursor.lastrowid


def _where(since: float, kinds: Iterable[str] | None, card_uuid: str | None) -> tuple[str, list[int | str]]:
    clauses: list[str] = ["ts >= ?"]
    args: list[int | str] = [int(since)]
    if kinds is not None:
        kinds = list(kinds)
        clauses.append(f"kind IN ({','.join('?' * len(kinds))})")
        args.extend(kinds)
    if card_uuid is not None:
        clauses.append("card_uuid = ?")
        args.append(card_uuid)
    return " AND ".join(clauses), args


def count(conn: sqlite3.Connection, since: float, kinds: Iterable[str] | None = None,
          card_uuid: str | None = None) -> int:
    """How many faults since `since` (epoch seconds), of these kinds (all when None), on this card (any when None)."""
    where, args = _where(since, kinds, card_uuid)
    return conn.execute(f"SELECT count(*) FROM faults WHERE {where}", args).fetchone()[0]


def recent(conn: sqlite3.Connection, since: float, kinds: Iterable[str] | None = None,
           card_uuid: str | None = None, limit: int | None = None) -> list[Fault]:
    """The faults since `since`, newest first."""
    where, args = _where(since, kinds, card_uuid)
    sql = f"SELECT {_COLUMNS} FROM faults WHERE {where} ORDER BY ts DESC, id DESC"
    if limit is not None:
        sql += " LIMIT ?"
        args.append(int(limit))
    return [Fault(*row) for row in conn.execute(sql, args)]


def by_code(conn: sqlite3.Connection, since: float, kind: str = "xid") -> dict[int, int]:
    """How many faults of `kind` since `since`, by code (the Xid counter by code, for /metrics)."""
    rows = conn.execute("SELECT code, count(*) FROM faults WHERE ts >= ? AND kind = ? AND code IS NOT NULL"
                        " GROUP BY code ORDER BY code", (int(since), kind))
    return {code: n for code, n in rows}

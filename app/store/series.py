"""Series rows (standing slots): the SQL, and nothing else. Rules live in app.service.rules.series.

A series row holds what was asked (`rule`, JSON: app.core.series.Rule plus cards, class and note);
its occurrences are ordinary bookings that carry its id in `bookings.series_id`.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from app.model import Booking
from app.store import bookings as rows
from app.store.db import MalformedRow, inserted_id, need, need_json_object, report_malformed


@dataclass(frozen=True, slots=True)
class Series:
    id: int
    user: str
    uid: int
    rule: dict[str, Any]
    created_at: int


def insert(conn: sqlite3.Connection, *, user: str, uid: int, rule: dict[str, Any], now: int) -> int:
    cursor = conn.execute('INSERT INTO series ("user", uid, rule, created_at) VALUES (?, ?, ?, ?)',
                          (user, uid, json.dumps(rule, sort_keys=True), now))
    return inserted_id(cursor)


def get(conn: sqlite3.Connection, series_id: int) -> Series | None:
    """The series, or None when there is none or its row is malformed (which is reported)."""
    row = conn.execute('SELECT id, "user", uid, rule, created_at FROM series WHERE id = ?', (series_id,)).fetchone()
    if row is None:
        return None
    id_, user, uid, rule, created_at = row
    try:
        for value, kind, column in ((user, str, "user"), (uid, int, "uid"), (created_at, int, "created_at")):
            need(value, kind, column)
        decoded = need_json_object(rule, "rule")
    except MalformedRow as error:
        report_malformed(conn, "series", series_id, error)
        return None
    return Series(id_, user, uid, decoded, created_at)


def set_rule(conn: sqlite3.Connection, series_id: int, rule: dict[str, Any]) -> None:
    conn.execute("UPDATE series SET rule = ? WHERE id = ?", (json.dumps(rule, sort_keys=True), series_id))


def first_occurrence(conn: sqlite3.Connection, series_id: int) -> int | None:
    """The id of the series' earliest booking (its cards name the host the series is on), or None."""
    return conn.execute("SELECT min(id) FROM bookings WHERE series_id = ?", (series_id,)).fetchone()[0]


def occurrences(conn: sqlite3.Connection, series_id: int) -> list[Booking]:
    """The series' bookings, cancelled ones too, earliest first."""
    ids = [r[0] for r in conn.execute(
        "SELECT id FROM bookings WHERE series_id = ? ORDER BY starts_at, id", (series_id,))]
    return [b for b in (rows.get(conn, i) for i in ids) if b is not None]

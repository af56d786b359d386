"""Planned servers: the SQL for `server_plans` and `server_plan_runs`, and nothing else. Rules live in
app.service.rules.plans; `board runner` starts them (app.service.runner).

A plan attaches a server spec (the `serve_start` options, JSON) to one booking or to every occurrence of a
series. At each occurrence's start the service has the runner start it once; the run row remembers which
server that occurrence got (or why it got none), so a crash is not restarted in a loop and a supervisor
the runner started is known to belong to the plan.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from app.store.db import MalformedRow, inserted_id, need, need_json_object, report_malformed

LIVE_SERVER_STATES = ("starting", "ready", "stopping")  # app.llama.rows.LIVE_STATES (the store may not import it)


@dataclass(frozen=True, slots=True)
class Plan:
    id: int
    booking_id: int | None
    series_id: int | None
    user: str
    uid: int
    alias: str
    spec: dict[str, Any]
    created_at: int
    cancelled_at: int | None = None


_COLUMNS = "p.id, p.booking_id, p.series_id, p.\"user\", p.uid, p.alias, p.spec, p.created_at, p.cancelled_at"


def _plan(conn: sqlite3.Connection, row) -> Plan | None:
    id_, booking_id, series_id, user, uid, alias, spec, created_at, cancelled_at = row
    try:
        for value, kind, column in ((user, str, "user"), (uid, int, "uid"), (alias, str, "alias"),
                                    (created_at, int, "created_at")):
            need(value, kind, column)
        decoded = need_json_object(spec, "spec")
    except MalformedRow as error:
        report_malformed(conn, "server plan", id_, error)
        return None
    return Plan(id_, booking_id, series_id, user, uid, alias, decoded, created_at, cancelled_at)


def _plans(conn: sqlite3.Connection, sql: str, args=()) -> list[Plan]:
    return [p for p in (_plan(conn, row) for row in conn.execute(sql, args)) if p is not None]


def insert(conn: sqlite3.Connection, *, booking_id: int | None, series_id: int | None, user: str, uid: int,
           alias: str, spec: dict[str, Any], now: int) -> int:
    cursor = conn.execute(
        'INSERT INTO server_plans (booking_id, series_id, "user", uid, alias, spec, created_at)'
        " VALUES (?, ?, ?, ?, ?, ?, ?)", (booking_id, series_id, user, uid, alias, json.dumps(spec, sort_keys=True), now))
    return inserted_id(cursor)


def get(conn: sqlite3.Connection, plan_id: int) -> Plan | None:
    found = _plans(conn, f"SELECT {_COLUMNS} FROM server_plans AS p WHERE p.id = ?", (plan_id,))
    return found[0] if found else None


def listing(conn: sqlite3.Connection, *, user: str | None = None, cancelled: bool = False) -> list[Plan]:
    sql = f"SELECT {_COLUMNS} FROM server_plans AS p WHERE true"
    args: list[Any] = []
    if not cancelled:
        sql += " AND p.cancelled_at IS NULL"
    if user is not None:
        sql += ' AND p."user" = ?'
        args.append(user)
    return _plans(conn, sql + " ORDER BY p.id", args)


def cancel(conn: sqlite3.Connection, plan_id: int, now: int) -> bool:
    return conn.execute("UPDATE server_plans SET cancelled_at = ? WHERE id = ? AND cancelled_at IS NULL",
                        (now, plan_id)).rowcount == 1


# The occurrences a plan covers: its booking, or every booking of its series; live ones only.
_OCCURRENCES = f"""
SELECT {_COLUMNS}, b.id, b.starts_at, b.ends_at
FROM server_plans AS p
JOIN bookings AS b ON (b.id = p.booking_id OR b.series_id = p.series_id)
WHERE p.cancelled_at IS NULL AND b.status = 'booked'
"""


def due(conn: sqlite3.Connection, now: int) -> list[tuple[Plan, int]]:
    """(plan, booking id) for each occurrence that is active now and has not been started yet, oldest first."""
    found = []
    for row in conn.execute(
            _OCCURRENCES + " AND b.starts_at <= ? AND b.ends_at > ? AND NOT EXISTS (SELECT 1 FROM server_plan_runs AS r"
            " WHERE r.plan_id = p.id AND r.booking_id = b.id) ORDER BY b.starts_at, p.id", (now, now)):
        plan = _plan(conn, row[:9])
        if plan is not None:
            found.append((plan, row[9]))
    return found


def holding(conn: sqlite3.Connection, alias: str, now: int) -> list[dict[str, Any]]:
    """Every occurrence under `alias` of a live plan that has not ended, whether its server runs or not (a plan holds
    its alias for its bookings' whole time): {"plan", "user", "uid", "booking", "start", "end"}, oldest plan first."""
    return [{"plan": row[0], "user": row[3], "uid": row[4], "booking": row[9], "start": row[10], "end": row[11]}
            for row in conn.execute(_OCCURRENCES + " AND p.alias = ? AND b.ends_at > ? ORDER BY p.id, b.starts_at",
                                    (alias, now))]


def own_plan(conn: sqlite3.Connection, booking_id: int, uid: int, alias: str) -> int | None:
    """The oldest live plan of `uid` under `alias` that covers this booking (itself or its series), or None."""
    return conn.execute(
        "SELECT min(p.id) FROM server_plans AS p JOIN bookings AS b ON (b.id = p.booking_id OR b.series_id = p.series_id)"
        " WHERE b.id = ? AND p.uid = ? AND p.alias = ? AND p.cancelled_at IS NULL", (booking_id, uid, alias)).fetchone()[0]


def pending_for(conn: sqlite3.Connection, booking_id: int) -> list[Plan]:
    """The live plans that will start a server on this booking (its own, or its series') and have not yet."""
    rows = conn.execute(_OCCURRENCES + " AND b.id = ? AND NOT EXISTS (SELECT 1 FROM server_plan_runs AS r"
                        " WHERE r.plan_id = p.id AND r.booking_id = b.id) ORDER BY p.id", (booking_id,))
    return [plan for row in rows if (plan := _plan(conn, row[:9])) is not None]


def record_run(conn: sqlite3.Connection, plan_id: int, booking_id: int, now: int, *, server_id: int | None = None,
               error: str | None = None) -> None:
    conn.execute("INSERT INTO server_plan_runs (plan_id, booking_id, server_id, started_at, error)"
                 " VALUES (?, ?, ?, ?, ?) ON CONFLICT (plan_id, booking_id) DO UPDATE SET server_id = excluded.server_id,"
                 " started_at = excluded.started_at, error = excluded.error", (plan_id, booking_id, server_id, now, error))


def last_refusal(conn: sqlite3.Connection, plan_id: int) -> dict[str, Any] | None:
    """Why the plan's latest start gave no server ({"booking", "error"}), or None when it gave one (or none yet)."""
    row = conn.execute("SELECT booking_id, error FROM server_plan_runs WHERE plan_id = ?"
                       " ORDER BY started_at DESC, booking_id DESC LIMIT 1", (plan_id,)).fetchone()
    return {"booking": row[0], "error": row[1]} if row and row[1] else None


def run_on(conn: sqlite3.Connection, booking_id: int) -> dict[str, Any] | None:
    """The latest start of a plan on this booking: {"plan", "server" (None: it gave none), "error"}; None: none yet."""
    row = conn.execute("SELECT plan_id, server_id, error FROM server_plan_runs WHERE booking_id = ?"
                       " ORDER BY started_at DESC, plan_id DESC LIMIT 1", (booking_id,)).fetchone()
    return {"plan": row[0], "server": row[1], "error": row[2]} if row else None


def plan_of_server(conn: sqlite3.Connection, server_id: int) -> int | None:
    """The plan whose occurrence started this server, or None for a server a member started."""
    row = conn.execute("SELECT plan_id FROM server_plan_runs WHERE server_id = ?", (server_id,)).fetchone()
    return row[0] if row else None


def upcoming(conn: sqlite3.Connection, now: int, *, plan_id: int | None = None) -> list[dict[str, Any]]:
    """The occurrences that have not ended and whose server is not up yet (not started, or still starting):
    {"plan", "alias", "booking", "start", "end", "user"}, earliest first."""
    sql = _OCCURRENCES + (" AND b.ends_at > ? AND NOT EXISTS (SELECT 1 FROM server_plan_runs AS r"
                          " LEFT JOIN servers AS s ON s.id = r.server_id WHERE r.plan_id = p.id AND r.booking_id = b.id"
                          " AND (s.state IS NULL OR s.state != 'starting'))")
    args: list[Any] = [now]
    if plan_id is not None:
        sql += " AND p.id = ?"
        args.append(plan_id)
    found = []
    for row in conn.execute(sql + " ORDER BY b.starts_at, p.id", args):
        found.append({"plan": row[0], "alias": row[5], "booking": row[9], "start": row[10], "end": row[11],
                      "user": row[3]})
    return found


def planned_servers(conn: sqlite3.Connection, now: int) -> list[dict[str, Any]]:
    """What the gateway shows as planned (CONTRACT20): [{"alias", "booking", "start", "end", "user"}] for each
    occurrence of a live plan that has not ended and whose server is not up yet, earliest first."""
    return [{key: item[key] for key in ("alias", "booking", "start", "end", "user")} for item in upcoming(conn, now)]

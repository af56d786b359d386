"""The gateway's keys and accounting rows: the SQL, and nothing else. Rules live in app.service.ops.gateway.

api_keys holds a key's hash and fingerprint (app.core.keys), never the key; gateway_usage one row per request
that the gateway answered, as it reported them (op gateway_usage).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, NotRequired, TypedDict

from app.store.db import inserted_id

_KEY_COLUMNS = 'id, name, "user", uid, hash, fingerprint, models, class, created_at, expires_at, revoked_at, project'


def _key(row) -> dict[str, Any]:
    id_, name, user, uid, hashed, fp, models, klass, created, expires, revoked, project = row
    try:
        models = json.loads(models) if models else None
    except ValueError:
        models = []  # a hand-edited row opens nothing rather than everything
    return {"id": id_, "name": name, "user": user, "uid": uid, "hash": hashed, "fingerprint": fp, "models": models,
            "class": klass, "created": created, "expires": expires, "revoked": revoked, "project": project}


def insert(conn: sqlite3.Connection, *, name: str, user: str, uid: int, hashed: str, fingerprint: str,
           models: list[str] | None, klass: str, now: int, created_by: int, expires_at: int | None,
           project: str = "") -> int:
    cursor = conn.execute(
        'INSERT INTO api_keys (name, "user", uid, hash, fingerprint, models, class, created_at, created_by, expires_at,'
        " project) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (name, user, uid, hashed, fingerprint, json.dumps(models) if models is not None else None, klass, now,
         created_by, expires_at, project))
    return inserted_id(cursor)


def get(conn: sqlite3.Connection, key_id: int) -> dict[str, Any] | None:
    row = conn.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    return _key(row) if row else None


def listing(conn: sqlite3.Connection, uid: int | None = None, live_at: int | None = None) -> list[dict[str, Any]]:
    """Keys, newest first: of `uid` only when given; only the usable ones (not revoked, not expired) at `live_at`."""
    where, args = [], []
    if uid is not None:
        where.append("uid = ?")
        args.append(uid)
    if live_at is not None:
        where.append("revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?)")
        args.append(live_at)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return [_key(r) for r in conn.execute(f"SELECT {_KEY_COLUMNS} FROM api_keys{clause} ORDER BY id DESC", args)]


def issued_by_self(conn: sqlite3.Connection, uid: int, now: int) -> int:
    """How many usable keys (not revoked, not expired at `now`) `uid` holds that they issued themselves."""
    return conn.execute("SELECT COUNT(*) FROM api_keys WHERE uid = ? AND created_by = ? AND revoked_at IS NULL"
                        " AND (expires_at IS NULL OR expires_at > ?)", (uid, uid, now)).fetchone()[0]


def revoke(conn: sqlite3.Connection, key_id: int, now: int) -> bool:
    return conn.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                        (now, key_id)).rowcount == 1


def usual_class(conn: sqlite3.Connection, uid: int) -> str | None:
    """The class of most of the user's bookings (the last 200), or None when they have none."""
    row = conn.execute(
        "SELECT class, COUNT(*) AS n FROM (SELECT class FROM bookings WHERE uid = ? AND status = 'booked'"
        " ORDER BY id DESC LIMIT 200) AS recent GROUP BY class ORDER BY n DESC, class LIMIT 1", (uid,)).fetchone()
    return row[0] if row else None


USAGE_FIELDS = ("ts", "key_id", "fingerprint", "user", "model", "server_id", "status", "prompt_tokens",
                "completion_tokens", "ttft_ms", "duration_ms", "request", "project")


def record_usage(conn: sqlite3.Connection, records: list[dict[str, Any]]) -> None:
    """The records, each once: one whose `request` (the gateway's id for it) is here already is skipped (a batch
    sent again because its reply was lost)."""
    columns = ", ".join(f'"{f}"' for f in USAGE_FIELDS)  # quoted: "user" is a keyword in PostgreSQL
    conn.executemany(f"INSERT INTO gateway_usage ({columns}) VALUES ({', '.join('?' * len(USAGE_FIELDS))})"
                     " ON CONFLICT DO NOTHING", [tuple(r.get(f, "" if f == "project" else None) for f in USAGE_FIELDS)
                                                      for r in records])  # no project: the implicit one


_BY = {"user": '"user"', "key": "fingerprint", "model": "model", "project": "project"}


class UsageRow(TypedDict):
    user: str  # "" where the rows summed differ
    key: str  # the key's fingerprint
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    errors: int  # answered with a status of 400 or more
    project: NotRequired[str]  # by project only: the [[projects]] entry its key is for ('' for none)


def usage(conn: sqlite3.Connection, since: int, by: str) -> list[UsageRow]:
    """Sums since `since`, grouped `by` user, key, model or project (user, key and model shown; those not grouped by
    are summed over and show as "" when they differ; by project, each row names it)."""
    group = _BY[by]
    rows = conn.execute(
        f"SELECT {group}, CASE WHEN COUNT(DISTINCT \"user\") = 1 THEN MIN(\"user\") ELSE '' END,"
        " CASE WHEN COUNT(DISTINCT fingerprint) = 1 THEN MIN(fingerprint) ELSE '' END,"
        " CASE WHEN COUNT(DISTINCT model) = 1 THEN MIN(model) ELSE '' END,"
        " COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END)"
        f" FROM gateway_usage WHERE ts >= ? GROUP BY {group} ORDER BY SUM(prompt_tokens + completion_tokens) DESC,"
        f" {group}", (since,))
    found: list[UsageRow] = []
    for value, user, key, model, n, p, c, e in rows:
        row: UsageRow = {"user": user, "key": key, "model": model, "requests": n, "prompt_tokens": p or 0,
                         "completion_tokens": c or 0, "errors": e or 0}
        if by == "project":
            row["project"] = value
        found.append(row)
    return found


def last_request(conn: sqlite3.Connection, model: str) -> int | None:
    """When the gateway last answered a request for `model` (an alias), or None."""
    return conn.execute("SELECT MAX(ts) FROM gateway_usage WHERE model = ?", (model,)).fetchone()[0]


def tokens_by_project(conn: sqlite3.Connection, since: int) -> dict[str, int]:
    """project -> prompt and completion tokens since `since`: what the gateway's token budgets count."""
    return {project: total or 0 for project, total in conn.execute(
        "SELECT project, SUM(prompt_tokens + completion_tokens) FROM gateway_usage WHERE ts >= ? GROUP BY project",
        (since,))}


def tokens_by_project_hour(conn: sqlite3.Connection, since: int) -> list[tuple[str, int, int]]:
    """(project, hour, tokens) since `since`, hour by hour (epoch seconds of its start): fair share's past use."""
    return [(project, hour * 3600, total or 0) for project, hour, total in conn.execute(
        "SELECT project, ts / 3600, SUM(prompt_tokens + completion_tokens) FROM gateway_usage WHERE ts >= ?"
        " GROUP BY project, ts / 3600", (since,))]


def tokens_by_user(conn: sqlite3.Connection, since: int, until: int) -> dict[str, tuple[int, int, int]]:
    """user -> (requests, prompt tokens, completion tokens) in [since, until): `board report`'s figures."""
    return {user: (n, p or 0, c or 0) for user, n, p, c in conn.execute(
        'SELECT "user", COUNT(*), SUM(prompt_tokens), SUM(completion_tokens) FROM gateway_usage'
        ' WHERE ts >= ? AND ts < ? GROUP BY "user"', (since, until))}

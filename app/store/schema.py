"""Schema migrations, tracked with PRAGMA user_version and run under BEGIN IMMEDIATE.

Append a migration to MIGRATIONS; never edit one that has shipped.
"""

from __future__ import annotations

import sqlite3

_V1 = """
CREATE TABLE cards (
    uuid TEXT PRIMARY KEY,
    idx INTEGER NOT NULL,
    name TEXT,
    seen_at INTEGER NOT NULL
);

CREATE TABLE bookings (
    id INTEGER PRIMARY KEY,
    user TEXT NOT NULL,
    uid INTEGER NOT NULL,
    starts_at INTEGER NOT NULL,
    ends_at INTEGER NOT NULL,
    class TEXT NOT NULL DEFAULT 'experiment'
        CHECK (class IN ('online', 'batch', 'finetune', 'experiment')),
    note TEXT NOT NULL DEFAULT '',
    request TEXT,
    status TEXT NOT NULL DEFAULT 'booked' CHECK (status IN ('booked', 'cancelled')),
    created_at INTEGER NOT NULL,
    created_by INTEGER NOT NULL,
    CHECK (ends_at > starts_at)
);

CREATE TABLE booking_cards (
    card_uuid TEXT NOT NULL REFERENCES cards(uuid),
    booking_id INTEGER NOT NULL REFERENCES bookings(id) ON DELETE CASCADE,
    PRIMARY KEY (card_uuid, booking_id)
) WITHOUT ROWID;

CREATE INDEX booking_cards_by_booking ON booking_cards(booking_id);

-- The overlap query only ever looks at live bookings that end after some time.
CREATE INDEX bookings_live_by_end ON bookings(ends_at, starts_at) WHERE status = 'booked';

-- Backstops for writers that bypass the app: no card ever holds two overlapping live bookings.
CREATE TRIGGER booking_cards_no_overlap BEFORE INSERT ON booking_cards
WHEN (SELECT status FROM bookings WHERE id = NEW.booking_id) = 'booked'
BEGIN
    SELECT RAISE(ABORT, 'overlapping booking')
    FROM bookings AS new, booking_cards AS other JOIN bookings AS b ON b.id = other.booking_id
    WHERE new.id = NEW.booking_id AND other.card_uuid = NEW.card_uuid AND other.booking_id != NEW.booking_id
      AND b.status = 'booked' AND b.starts_at < new.ends_at AND b.ends_at > new.starts_at;
END;

CREATE TRIGGER bookings_no_overlap BEFORE UPDATE OF starts_at, ends_at, status ON bookings
WHEN NEW.status = 'booked'
BEGIN
    SELECT RAISE(ABORT, 'overlapping booking')
    FROM booking_cards AS mine
    JOIN booking_cards AS other ON other.card_uuid = mine.card_uuid AND other.booking_id != mine.booking_id
    JOIN bookings AS b ON b.id = other.booking_id
    WHERE mine.booking_id = NEW.id AND b.status = 'booked'
      AND b.starts_at < NEW.ends_at AND b.ends_at > NEW.starts_at;
END;

-- The audit log: append-only, each row chained to the previous one by hash.
CREATE TABLE events (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    uid INTEGER NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    booking_id INTEGER,
    ok INTEGER NOT NULL,
    details TEXT NOT NULL DEFAULT '{}',
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);

CREATE INDEX events_by_booking ON events(booking_id);

CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;

CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;

-- INSERT OR REPLACE deletes the old row without firing the delete trigger: no insert may reuse an id.
-- (An id the database assigns itself reads as -1 here.)
CREATE TRIGGER events_no_replace BEFORE INSERT ON events
WHEN NEW.id >= 0 AND NEW.id <= (SELECT coalesce(max(id), 0) FROM events)
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
"""

# v2: llama-servers started by board (app.llama). A live server's port is unique; the process identity
# (pid + create time + command line) of the server and of its supervisor guards every signal.
_V2 = """
CREATE TABLE servers (
    id INTEGER PRIMARY KEY,
    booking_id INTEGER NOT NULL REFERENCES bookings(id),
    user TEXT NOT NULL,
    uid INTEGER NOT NULL,
    cards TEXT NOT NULL,
    card_uuids TEXT NOT NULL,
    model TEXT NOT NULL,
    alias TEXT,
    host TEXT NOT NULL,
    port INTEGER NOT NULL,
    ctx INTEGER,
    parallel INTEGER,
    split_mode TEXT,
    metrics INTEGER NOT NULL DEFAULT 0,
    cmdline TEXT NOT NULL,
    log_path TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT 'starting'
        CHECK (state IN ('starting', 'ready', 'stopping', 'stopped', 'crashed', 'failed')),
    pid INTEGER,
    pid_started REAL,
    pgid INTEGER,
    supervisor_pid INTEGER,
    supervisor_started REAL,
    supervisor_cmdline TEXT,
    created_at INTEGER NOT NULL,
    ready_at INTEGER,
    ended_at INTEGER,
    exit_code INTEGER,
    exit_signal INTEGER,
    reason TEXT,
    log_tail TEXT
);

CREATE UNIQUE INDEX servers_live_port ON servers(port) WHERE state IN ('starting', 'ready', 'stopping');

CREATE INDEX servers_live ON servers(state) WHERE state IN ('starting', 'ready', 'stopping');

CREATE INDEX servers_by_booking ON servers(booking_id);
"""

# `board run` jobs the service holds a pidfd for, so that a restarted service adopts them again.
# Written by the service alone; (pid, started_ticks) names one process for the life of the machine.
_V3 = """
CREATE TABLE jobs (
    pid INTEGER NOT NULL,
    started_ticks INTEGER NOT NULL,
    booking_id INTEGER NOT NULL,
    uid INTEGER NOT NULL,
    pgid INTEGER NOT NULL,
    cards TEXT NOT NULL,
    registered_at INTEGER NOT NULL,
    PRIMARY KEY (pid, started_ticks)
);
"""

# v4: a server's memory, as JSON: `estimate` is board's per-card estimate the start was checked against
# (per_card_mib, limit_mib, fits, forced), `measured` what llama.cpp logged at load (app.llama.memory.Measured).
_V4 = """
ALTER TABLE servers ADD COLUMN estimate TEXT;
ALTER TABLE servers ADD COLUMN measured TEXT;
"""

# v5: booking semantics. `requested_at` is the moment the holder wanted the cards from (the start they asked
# for, or when they asked, if later): a wait is its start minus this. `queued` marks a booking that asked to
# move earlier when time frees up: 'time' on its own cards, 'cards' on any group of as many. A standing
# slot's occurrences share a `series_id`; `series.rule` is the JSON of what was asked (app.core.series).
# `notice` is the latest change someone else made to the booking (an admin, the backfill), for its holder.
_V5 = """
CREATE TABLE series (
    id INTEGER PRIMARY KEY,
    user TEXT NOT NULL,
    uid INTEGER NOT NULL,
    rule TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
ALTER TABLE bookings ADD COLUMN requested_at INTEGER;
ALTER TABLE bookings ADD COLUMN queued TEXT CHECK (queued IN ('time', 'cards'));
ALTER TABLE bookings ADD COLUMN series_id INTEGER REFERENCES series(id);
ALTER TABLE bookings ADD COLUMN notice TEXT;
UPDATE bookings SET requested_at = starts_at;
CREATE INDEX bookings_queued ON bookings(starts_at) WHERE queued IS NOT NULL AND status = 'booked';
CREATE INDEX bookings_by_series ON bookings(series_id) WHERE series_id IS NOT NULL;
"""

# v6: the notify outbox (app.notify): one row per message and target, written in the transaction that decides to
# push it, sent later by the service's delivery thread. `message` is JSON (app.notify.formats.Message), never the
# target's url. `key` makes an enqueue idempotent (one summary per slot). Sent and given-up rows are pruned.
_V6 = """
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY,
    target TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT,
    message TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    next_at INTEGER NOT NULL,
    last_status INTEGER,
    last_error TEXT,
    done_at INTEGER
);
CREATE INDEX outbox_due ON outbox(next_at) WHERE state = 'pending';
CREATE INDEX outbox_done ON outbox(done_at) WHERE state != 'pending';
CREATE UNIQUE INDEX outbox_by_key ON outbox(key, target) WHERE key IS NOT NULL;
"""

# v7: the team's monitor (issue 12). `faults`: what the seeds count (Xid events from NVML, OOM exits, thermal
# throttling with its duration), one row each, written by the service (app.faults). `alerts`: each rule's
# finding about one subject (a card uuid, a booking id, 'fleet'), firing then resolved (app.alerts); at most
# one firing row per rule and subject. `uid` set: for that user alone (their booking ends in 10 minutes).
_V7 = """
CREATE TABLE faults (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    card_uuid TEXT,
    kind TEXT NOT NULL CHECK (kind IN ('xid', 'oom', 'throttle')),
    code INTEGER,
    detail TEXT NOT NULL DEFAULT '',
    duration_s REAL,
    booking_id INTEGER,
    user TEXT
);
CREATE INDEX faults_by_ts ON faults(ts);
CREATE TABLE alerts (
    id INTEGER PRIMARY KEY,
    rule TEXT NOT NULL,
    subject TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('firing', 'resolved')),
    fired_at INTEGER NOT NULL,
    resolved_at INTEGER,
    last_seen INTEGER NOT NULL,
    message TEXT NOT NULL,
    uid INTEGER
);
CREATE UNIQUE INDEX alerts_firing ON alerts(rule, subject) WHERE state = 'firing';
CREATE INDEX alerts_by_time ON alerts(fired_at);
"""

# v8: what the team's chat was told of each alert, kept with the alert so that a restart neither loses a push
# that quiet hours hold back nor repeats one (app.alerts.engine). `pushed_at`: when its fire was pushed (NULL:
# it was not, so neither is its resolve); `held`: a push that quiet hours hold back, 'fire' (pushed when they
# end, if it still fires) or 'resolve' (the resolve of a pushed fire). A v7 alert counts as pushed when the
# outbox still has its push (sent rows are kept two days).
_V8 = """
ALTER TABLE alerts ADD COLUMN pushed_at INTEGER;
ALTER TABLE alerts ADD COLUMN held TEXT CHECK (held IN ('fire', 'resolve'));
UPDATE alerts SET pushed_at = fired_at
    WHERE EXISTS (SELECT 1 FROM outbox WHERE outbox.key = 'alert:' || alerts.id || ':firing');
CREATE INDEX alerts_held ON alerts(held) WHERE held IS NOT NULL;
CREATE INDEX alerts_by_subject ON alerts(rule, subject);
"""

# Issue 20 (shared with the runner's branch, byte-identical): each llama-server's own random API key, which its
# supervisor makes and reports; the gateway sends it upstream. Never in serve list/status output.
_V_SERVER_KEYS = "ALTER TABLE servers ADD COLUMN api_key TEXT;\n"

# Issue 20: the gateway's keys (only a hash and a short fingerprint are kept: the key is printed once) and its
# accounting, one row per request (app.store.keys). `models` is a JSON list of aliases, NULL for every model.
_V_GATEWAY_KEYS = """
CREATE TABLE api_keys (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL DEFAULT '',
    user TEXT NOT NULL,
    uid INTEGER NOT NULL,
    hash TEXT NOT NULL UNIQUE,
    fingerprint TEXT NOT NULL,
    models TEXT,
    class TEXT NOT NULL CHECK (class IN ('online', 'batch', 'finetune', 'experiment')),
    created_at INTEGER NOT NULL,
    created_by INTEGER NOT NULL,
    expires_at INTEGER,
    revoked_at INTEGER
);
CREATE INDEX api_keys_by_user ON api_keys(uid);
CREATE TABLE gateway_usage (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    key_id INTEGER,
    fingerprint TEXT NOT NULL DEFAULT '',
    user TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '',
    server_id INTEGER,
    status INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    ttft_ms INTEGER,
    duration_ms INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX gateway_usage_by_time ON gateway_usage(ts);
"""


# A fault kind more (issue 23): `build`, a llama-server whose log says "no kernel image is available" (built without
# its cards' architecture). SQLite cannot change a CHECK in place: the table is copied into a new one.
_V_FAULT_BUILD = """
CREATE TABLE faults_new (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    card_uuid TEXT,
    kind TEXT NOT NULL CHECK (kind IN ('xid', 'oom', 'throttle', 'build')),
    code INTEGER,
    detail TEXT NOT NULL DEFAULT '',
    duration_s REAL,
    booking_id INTEGER,
    user TEXT
);
INSERT INTO faults_new (id, ts, card_uuid, kind, code, detail, duration_s, booking_id, user)
    SELECT id, ts, card_uuid, kind, code, detail, duration_s, booking_id, user FROM faults;
DROP TABLE faults;
ALTER TABLE faults_new RENAME TO faults;
CREATE INDEX faults_by_ts ON faults(ts);
"""

# Planned servers (`board serve plan`): a server spec attached to one booking or to every occurrence of a series,
# started by `board runner` at each start (app.store.plans); `server_plan_runs` remembers the server each
# occurrence got, so that an occurrence is started once and a runner's supervisor is known as the plan's.
_V_SERVER_PLANS = """
CREATE TABLE server_plans (
    id INTEGER PRIMARY KEY,
    booking_id INTEGER REFERENCES bookings(id),
    series_id INTEGER REFERENCES series(id),
    user TEXT NOT NULL,
    uid INTEGER NOT NULL,
    alias TEXT NOT NULL,
    spec TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    cancelled_at INTEGER,
    CHECK ((booking_id IS NULL) != (series_id IS NULL))
);
CREATE INDEX server_plans_by_booking ON server_plans(booking_id) WHERE booking_id IS NOT NULL;
CREATE INDEX server_plans_by_series ON server_plans(series_id) WHERE series_id IS NOT NULL;
CREATE TABLE server_plan_runs (
    plan_id INTEGER NOT NULL REFERENCES server_plans(id),
    booking_id INTEGER NOT NULL REFERENCES bookings(id),
    server_id INTEGER REFERENCES servers(id),
    started_at INTEGER NOT NULL,
    error TEXT,
    PRIMARY KEY (plan_id, booking_id)
);
CREATE INDEX server_plan_runs_by_server ON server_plan_runs(server_id) WHERE server_id IS NOT NULL;
"""

# Many hosts, one board: each card belongs to a host ('' = recorded before the fleet: the service claims those
# for its own host), and each host's service writes its heartbeat and latest snapshot (JSON,
# app.gpu.model.snapshot_to_wire) to `hosts` about once a second.
_V_FLEET_HOSTS = """
ALTER TABLE cards ADD COLUMN host TEXT NOT NULL DEFAULT '';
CREATE TABLE hosts (
    host TEXT PRIMARY KEY,
    seen_at REAL NOT NULL,
    started_at REAL NOT NULL,
    snapshot TEXT NOT NULL
);
"""

# Whose rows these are in a fleet: the [fleet] host whose service registered the job or started the server ('' =
# recorded before the fleet). servers.host is the address a server listens on, hence fleet_host. On PostgreSQL the
# database holds each host to its own rows by them (app.store.pg_schema's _V_FLEET_ROW_SECURITY).
_V_FLEET_ROW_HOSTS = """
ALTER TABLE jobs ADD COLUMN host TEXT NOT NULL DEFAULT '';
ALTER TABLE servers ADD COLUMN fleet_host TEXT NOT NULL DEFAULT '';
"""

# Each accounting record carries the gateway's id for it: a batch sent again after its reply was lost (the service
# committed, then went away) is recorded once (app.store.keys.record_usage skips an id it has).
_V_USAGE_ONCE = """
ALTER TABLE gateway_usage ADD COLUMN request TEXT;
CREATE UNIQUE INDEX gateway_usage_once ON gateway_usage(request) WHERE request IS NOT NULL;
"""

# Projects ([[projects]], app.core.projects): a booking, a key and an accounting record carry the project
# they are for (a series keeps it in its rule); '' is the implicit one of a board without projects. A server's is its booking's.
_V_PROJECTS = """
ALTER TABLE bookings ADD COLUMN project TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN project TEXT NOT NULL DEFAULT '';
ALTER TABLE gateway_usage ADD COLUMN project TEXT NOT NULL DEFAULT '';
"""

MIGRATIONS: list[str] = [_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V_SERVER_KEYS, _V_GATEWAY_KEYS, _V_FAULT_BUILD,
                         _V_SERVER_PLANS, _V_FLEET_HOSTS, _V_FLEET_ROW_HOSTS, _V_USAGE_ONCE,
                         _V_PROJECTS]
LATEST = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema to LATEST. Safe to race: the version is re-read under the write lock."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > LATEST:
            raise sqlite3.DatabaseError(
                f"the database has schema version {version}, newer than this board ({LATEST}); upgrade board"
            )
        for number in range(version, LATEST):
            for statement in _statements(MIGRATIONS[number]):
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {LATEST}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite has already rolled back after some errors (a full disk)
            conn.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT our transaction; split on complete statements instead.
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--"):
            continue
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return statements

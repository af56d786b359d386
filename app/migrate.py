"""`board migrate --to postgresql://...`: an existing install's SQLite database copied into an empty PostgreSQL one.

Every table of the SQLite database (app.store.schema at LATEST) is read from one read snapshot and written into the
target in one transaction, ids as they were (the database's sequences then move past them), by COPY. Before that
transaction commits, each table's row count on the target is compared with the source's and the audit chain is
checked there (app.store.events.first_broken): a difference rolls everything back. A target that already holds a
board (its schema, or any board table) is refused with nothing written; so is a second run.

The copy is faithful: a chain that an edit by hand broke in the SQLite file is broken at the same event on the target
(the evidence moves with the data), and the caller says so. Columns are matched by name, so a table the PostgreSQL
schema has and SQLite's has not (hosts), or a column only one side has (booking_cards' span, filled by its trigger),
is simply not copied. The history file's 5-minute rollups (and squats) go in the same transaction, tagged with this
host (the raw samples stay in the file), so `board report` on the new store has this host's past; so are the jobs and
servers. It runs as the role that owns the database (the hosts' roles may not make tables: docs/fleet.md), which
row-level security does not bind. `--schema-only` makes or upgrades the schema alone (a new fleet, an upgrade).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.config import PostgresStore
from app.errors import BadInput, BoardError, NotPermitted
from app.store import events
from app.store.db import connect

Progress = Callable[[str, int], None]  # (table, rows copied), after each table


@dataclass(frozen=True, slots=True)
class Migrated:
    target: str  # where, for people: host:port/dbname, never the password
    rows: dict[str, int]  # table -> rows copied, in the order they were
    events: int
    first_broken_event: int | None  # the source's own, copied as it is

    def summary(self, source: Path) -> str:
        total = sum(self.rows.values())
        chain = (f"audit chain intact ({self.events:,} events)" if self.first_broken_event is None
                 else f"audit chain broken at event {self.first_broken_event}, as in {source}")
        return (f"copied {source} to {self.target}: {len(self.rows)} tables, {total:,} rows, each table's count"
                f" checked; {chain}")


def check_url(url: str) -> str:
    """The url if it is a libpq URI board can use; else BadInput in one line."""
    from psycopg.conninfo import conninfo_to_dict  # start-up: only board migrate loads the driver

    wanted = "--to must be a PostgreSQL URI such as postgresql://board_gpu1@db1/board"
    if not url.startswith(("postgresql://", "postgres://")):
        raise BadInput(f"{wanted} (got {_shown(url)})")
    try:
        info = conninfo_to_dict(url)
    except Exception as error:  # noqa: BLE001 - psycopg's ProgrammingError, its first line is the reason
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BadInput(f"{wanted}: {reason}") from None
    if not all(port.isdigit() for port in str(info.get("port") or "5432").split(",")):
        raise BadInput(f"{wanted}: the port must be a number (got {_shown(str(info['port']))})")
    if not info.get("dbname"):
        raise BadInput(f"{wanted}: name the database (the path after the host)")
    return url


def migrate(source: Path, target: PostgresStore, progress: Progress | None = None, *,
            history: Path | None = None) -> Migrated:
    """Copy the board at `source` into the empty database `target`, and the 5-minute rollups of the history file
    `history` (if there is one) tagged with `target.host`; see the module's docstring."""
    from app.store.pg import PgConnection, where

    check_url(target.url)
    place = where(target.url)
    src = connect(source, create=False)
    try:
        src.execute("BEGIN")  # one read snapshot for every table (WAL: writers, if any, do not move it)
        try:
            tables = _tables(src)
            counts = {name: src.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] for name in tables}
            broken = events.first_broken(src)
            dst = PgConnection(target)  # StoreUnreachable: the one line, exit 1
            try:
                rows = _copy(src, dst, tables, counts, broken, place, progress or (lambda table, n: None),
                             history if history is not None and history.is_file() else None, target.host)
            finally:
                dst.close()
        finally:
            src.execute("ROLLBACK")
    finally:
        src.close()
    return Migrated(place, rows, counts.get("events", 0), broken)


def make_schema(target: PostgresStore) -> str:
    """Make or upgrade the board's schema in `target` (as its owner: the hosts' roles may not), copying nothing;
    returns where, for the summary line."""
    from app.store.pg import PgConnection, ensure_schema, where

    from app.store.db import storage_error

    check_url(target.url)
    conn = PgConnection(target)
    try:
        ensure_schema(conn)
    except sqlite3.Error as error:  # app.store.pg's: a newer schema, a role that may not (not permitted)
        raise storage_error(target, error) from None
    finally:
        conn.close()
    return where(target.url)


def _copy(src, dst, tables: list[str], counts: dict[str, int], broken: int | None, place: str,
          progress: Progress, history: Path | None, host: str) -> dict[str, int]:
    import psycopg  # start-up: loaded by the connection already

    from app.store.pg import WRITE_LOCK, apply_migrations

    raw = dst.raw
    done: dict[str, int] = {}
    try:
        raw.execute("BEGIN")
        # Alone on the calendar while copying; no statement or idle limit (a year of events takes a while to hash).
        raw.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
        raw.execute("SET LOCAL statement_timeout = 0")
        raw.execute("SET LOCAL idle_in_transaction_session_timeout = 0")
        if held := _holds_board(raw, tables):
            raise BadInput(f"{place} already holds a board ({held}): board migrate copies into an empty database"
                           " only (createdb a new one); nothing was written")
        apply_migrations(raw)  # inside this transaction: the schema goes in with the rows, or not at all
        columns = _target_columns(raw)
        for table in tables:
            if table not in columns:
                raise BoardError(f"the PostgreSQL schema has no table {table}, which {src.path} has: this board"
                                 " cannot copy it (upgrade board); nothing was written")
            done[table] = _copy_table(src, raw, table, columns[table])
            progress(table, done[table])
        _move_sequences(raw)
        # One host's install: its jobs and servers are this host's (rows from before the fleet say '').
        raw.execute("UPDATE jobs SET host = %s WHERE host = ''", (host,))
        raw.execute("UPDATE servers SET fleet_host = %s WHERE fleet_host = ''", (host,))
        if history is not None:
            for table, copied in _copy_rollups(history, raw, host).items():
                there = raw.execute(f'SELECT count(*) FROM "{table}" WHERE host = %s', (host,)).fetchone()[0]
                if copied != there:
                    raise BoardError(f"{table}: {copied:,} rows in {history}, {there:,} on {place} after the copy;"
                                     " nothing was written")
                done[table] = copied
                progress(table, copied)
        for table in tables:
            there = raw.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            if not counts[table] == done[table] == there:
                raise BoardError(f"{table}: {counts[table]:,} rows in the source, {there:,} on {place} after the copy;"
                                 " nothing was written")
        if (copied_break := events.first_broken(dst)) != broken:
            said = "intact" if broken is None else f"broken at event {broken}"
            raise BoardError(f"the copied audit chain breaks at event {copied_break} on {place}, but the source's is {said};"
                             " nothing was written")
        raw.execute("COMMIT")
    except psycopg.errors.InsufficientPrivilege as error:
        _rollback(raw)
        raise NotPermitted(f"copying into {place} failed: {_reason(error)}: run board migrate as the role that owns"
                           " the database (docs/fleet.md); nothing was written") from None
    except psycopg.Error as error:
        _rollback(raw)
        raise BoardError(f"copying into {place} failed: {_reason(error)}; nothing was written") from None
    except sqlite3.Error as error:  # includes app.store.pg's mapped errors (ensure_schema, first_broken)
        _rollback(raw)
        raise BoardError(f"copying into {place} failed: {error}; nothing was written") from None
    except BaseException:
        _rollback(raw)
        raise
    return done


def _copy_rollups(history: Path, raw, host: str) -> dict[str, int]:
    """The history file's rollups and squats into the store's (as app.history.fleet pushes them), tagged `host`."""
    from app.history.fleet import PUSH_BUCKETS
    from app.history.store import ROLLUP_COLUMNS, HistoryStore

    store = HistoryStore(history)
    squats: list[tuple] = []
    copied, after = 0, None
    try:
        with raw.cursor().copy(f"COPY rollups (host, card_uuid, ts, {', '.join(ROLLUP_COLUMNS)}) FROM STDIN") as copy:
            while True:
                rollups, found = store.rollup_rows(after, PUSH_BUCKETS)
                if not rollups:
                    break
                for row in rollups:
                    copy.write_row((host, *row))
                squats += found
                copied += len(rollups)
                after = rollups[-1][1]
        with raw.cursor().copy('COPY rollup_squats (host, card_uuid, ts, "user", n) FROM STDIN') as copy:
            for row in squats:
                copy.write_row((host, *row))
    finally:
        store.close()
    return {"rollups": copied, "rollup_squats": len(squats)}


def _tables(src) -> list[str]:
    """The board's tables, each after the tables its foreign keys name (bookings before booking_cards)."""
    names = [row[0] for row in src.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%' ORDER BY name")]
    needs = {name: {row[2] for row in src.execute(f'PRAGMA foreign_key_list("{name}")')} - {name} for name in names}
    ordered: list[str] = []
    while needs:
        ready = sorted(name for name, parents in needs.items() if parents <= set(ordered))
        if not ready:  # a cycle, which board's schema never has: keep going in name order
            ready = sorted(needs)
        for name in ready:
            ordered.append(name)
            del needs[name]
    return ordered


def _holds_board(raw, tables: list[str]) -> str:
    """What board data the target already holds, in a few words; '' when it holds none."""
    if raw.execute("SELECT to_regclass('board_schema') IS NOT NULL").fetchone()[0]:
        version = raw.execute("SELECT max(version) FROM board_schema").fetchone()[0]
        if version is not None:
            return f"schema version {version}"
    found = []
    for table in ["board_schema", *tables, "hosts", "rollups"]:
        if raw.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]:
            rows = raw.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
            found.append(f"{rows:,} {table}" if rows else f"an empty table {table}")
    return ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")


def _target_columns(raw) -> dict[str, list[str]]:
    columns: dict[str, list[str]] = {}
    for table, column in raw.execute("SELECT table_name, column_name FROM information_schema.columns"
                                     " WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"):
        columns.setdefault(table, []).append(column)
    return columns


def _copy_table(src, raw, table: str, target_columns: list[str]) -> int:
    info = list(src.execute(f'PRAGMA table_info("{table}")'))
    names = [row[1] for row in info]
    wanted = [name for name in names if name in target_columns]
    # cards' rowid is a column on PostgreSQL (the calendar orders by it) and SQLite's hidden one: keep the number.
    rowid = "rowid" in target_columns and "rowid" not in names and _has_rowid(src, table)
    select = ", ".join([*(f'"{name}"' for name in wanted), *(["rowid"] if rowid else [])])
    key = [row[1] for row in sorted(info, key=lambda row: row[5]) if row[5]] or (["rowid"] if rowid else wanted[:1])
    order = ", ".join(f'"{name}"' if name != "rowid" else "rowid" for name in key)
    into = ", ".join([*(f'"{name}"' for name in wanted), *(['"rowid"'] if rowid else [])])
    copied = 0
    with raw.cursor().copy(f'COPY "{table}" ({into}) FROM STDIN') as copy:
        for row in src.execute(f'SELECT {select} FROM "{table}" ORDER BY {order}'):
            copy.write_row(row)
            copied += 1
    return copied


def _has_rowid(src, table: str) -> bool:
    try:
        src.execute(f'SELECT rowid FROM "{table}" LIMIT 0')
    except sqlite3.OperationalError:  # a WITHOUT ROWID table
        return False
    return True


def _move_sequences(raw) -> None:
    """Each identity column's next value: one past the largest id copied (1 for an empty table)."""
    for table, column in list(raw.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND is_identity = 'YES'")):
        raw.execute(f'SELECT setval(pg_get_serial_sequence(%s, %s), coalesce(max("{column}"), 0) + 1, false)'
                    f' FROM "{table}"', (f'"{table}"', column))


def _rollback(raw) -> None:
    try:
        raw.execute("ROLLBACK")
    except Exception:  # noqa: BLE001 - the connection broke: the server rolled back for us; the first error says more
        pass


def _reason(error: BaseException) -> str:
    diag = getattr(error, "diag", None)
    text = (getattr(diag, "message_primary", None) or str(error) or type(error).__name__).strip().splitlines()[0]
    context = (getattr(diag, "context", None) or "").strip().splitlines()
    return f"{text} ({context[0]})" if context else text


def _shown(text: str) -> str:
    return ascii(text.split("@")[-1][:60])


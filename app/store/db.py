"""Connections to the board's store: the one shared SQLite file (WAL, a long busy timeout, foreign keys, short IMMEDIATE
writes), or with [storage] url a PostgreSQL database shared by every host's service (app.store.pg)."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypeVar

from app.config import PostgresStore
from app.errors import BadInput, BoardError, NotPermitted
from app.store import schema
from app.store.filesystem import network_filesystem

if TYPE_CHECKING:
    from app.store.pg import PgConnection

BUSY_TIMEOUT_MS = 10_000
T = TypeVar("T")

_malformed: dict[tuple[str, str, object], str] = {}  # (database, kind, row id) -> the line logged, once


class StoreError(BoardError):
    """The database cannot be used; the message says what to do."""


class StoreLocked(StoreError):
    """A PostgreSQL write waited its lock timeout for a lock another session holds (the message names who): nothing
    was changed, and the database still answers reads."""


class BoardConnection(sqlite3.Connection):
    """A connection that remembers the file it opened, so a failed write can name it."""

    path: Path
    fleet_host: str  # set by the service only (app.service): the host its audit events name; read with getattr


def connect(path: Path | PostgresStore, *, create: bool = True) -> BoardConnection:
    """Open the board database, creating and migrating it on first use: `path` is Config.store (or a SQLite file)."""
    if isinstance(path, PostgresStore):
        # a PgConnection: it answers as sqlite3's does (app.store.pg), without being one
        return connect_pg(path)  # type: ignore[return-value]
    path = Path(path)
    try:
        kind = network_filesystem(path)
        exists = _exists(path)
    except PermissionError:  # a directory we may not search: the service's 0700 one, to anyone but the service
        raise _access_error(path, sqlite3.OperationalError("unable to open database file")) from None
    if kind:
        raise StoreError(
            f"{path} is on a {kind} filesystem; SQLite's WAL needs a local disk: set BOARD_DB to a local path"
        )
    if not exists and not path.parent.is_dir():
        raise BadInput(f"the directory {path.parent} does not exist; create it, or set BOARD_DB to a database file"
                       " of your own")
    if not exists and not create:
        raise StoreError(f"no board database at {path}; set BOARD_DB to yours (the board service creates its own"
                         " at its first start)")
    if exists and not path.is_file():
        raise BadInput(f"{path} is not a file, so not a board database; set BOARD_DB to the board's database file")
    _refuse_planted_links(path)
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=True,
                               factory=BoardConnection)
        conn.path = path
        # A hand-edited row with bytes that are not UTF-8 must not crash every reader (doctor shows the edit).
        conn.text_factory = _decode_text
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        # An acknowledged booking survives a power cut, not only a crash: the WAL is synced at each commit (NORMAL
        # syncs only at checkpoints). About 0.3 ms a commit here; the service's group commit shares one among bookings.
        conn.execute("PRAGMA synchronous = FULL")
        if conn.execute("PRAGMA user_version").fetchone()[0] != schema.LATEST:
            schema.migrate(conn)
    except sqlite3.Error as error:
        raise storage_error(path, error) from None
    return conn


def connect_pg(store: PostgresStore) -> PgConnection:
    """Open a PostgreSQL store: where the code needs PostgreSQL's own parts (LISTEN, the database's clock)."""
    from app.store import pg  # start-up: only a PostgreSQL store loads it (and psycopg)

    try:
        return pg.connect(store)
    except sqlite3.Error as error:
        raise storage_error(store, error) from None


def _exists(path: Path) -> bool:
    """Whether `path` names something; a symlink loop is its own error, not 'no such file'."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError:
        raise
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _loop_error(path) from None
        raise BadInput(f"can't use {path} as the board database ({error.strerror}); set BOARD_DB to a local path") from None
    return True


def _refuse_planted_links(path: Path) -> None:
    """The -wal, -shm and -journal beside the database are SQLite's own files: never follow a link there.

    Anyone who may write the board directory could plant `board.db-wal -> /etc/shadow`, and the next
    board that opens the database (perhaps root's) would write its journal through the link.
    """
    for suffix in ("-wal", "-shm", "-journal"):
        side = Path(f"{path}{suffix}")
        try:
            planted = side.is_symlink()
        except OSError:  # can't look: SQLite's own open will say why
            continue
        if planted:
            raise StoreError(f"{side} is a symbolic link (to {os.readlink(side)}), not SQLite's own file;"
                             f" nothing was opened: remove the symlink {side}, then run 'board doctor'")


@contextmanager
def write(conn: sqlite3.Connection, *, cards: Iterable[str] = (), user: str | None = None, savepoint: str | None = None,
          own: bool = False, new_booking: bool = False, reads: tuple[int, int] | None = None
          ) -> Iterator[sqlite3.Connection]:
    """One short write transaction: BEGIN IMMEDIATE takes the write lock up front, so checks and writes agree.

    A full disk, a read-only file or filesystem, or an I/O error while writing becomes a StoreError that
    names the database (see storage_error); other errors (a trigger's refusal) pass through unchanged.

    On PostgreSQL, BEGIN and then advisory locks taken before anything is read, always in one order (the store's,
    the cards', the user's, the audit chain's), so a race ends in a clean conflict and never in a deadlock:
    - without `cards`, the store's write lock (app.store.pg.WRITE_LOCK) alone, exclusive: writers on every host
      serialise as SQLite's do;
    - with `cards` (UUIDs: all the write's rules read and change, e.g. a booking on cards it names) and `user`
      (whose limits they read), that lock shared, then one lock per card, sorted, and one for the user; the audit
      chain's own lock goes with the append, which goes with the COMMIT (chain_lock). Writes on other cards, by other
      users, run alongside; only the chain's append and the commit are serial. SQLite ignores them.

    `savepoint`: a SAVEPOINT of that name, set right after the locks (on PostgreSQL in the same round trip).

    `new_booking`: the write may insert a booking. On PostgreSQL its id is taken with the locks (in the same round
    trip), so that its insert, its audit event and the COMMIT go together in one more (app.store.bookings.insert,
    app.store.events.record, PgConnection.defer).

    `reads` (start, end): on PostgreSQL with `cards` and `user`, the live bookings on those cards or of that user
    that overlap [start, end) are read with the locks, in the same round trip, and the write's reads of them within
    that span are answered from there
    (app.store.bookings.Prefetched): under those locks no other writer changes them (but for an on-demand booking
    that reaches past them: Prefetched sends what may take it in to SQL).

    `own`: the write changes only this host's own rows (its heartbeat, its cards), which row-level security keeps to
    it and which no other write changes: on PostgreSQL it takes no advisory lock, so a host that holds the store's
    lock (a compromised one) stops no other host's heartbeat.

    A lock that stays taken for LOCK_TIMEOUT_MS (app.store.pg, set by each service on its own session, so a holder
    cannot lift it for others) ends the write with StoreLocked, naming who holds it; for HELD_FOR_S after that, this
    connection's writes wait HELD_LOCK_TIMEOUT_MS at most, until one takes its locks.

    On SQLite inside a transaction already (the service's group commit, app.service.door.writer) it is a savepoint of
    that transaction: an error rolls back to it, and only it, and passes through.
    """
    if is_postgres(conn):
        yield from _write_pg(conn, tuple(cards), user, savepoint, own, new_booking, reads)
        return
    if conn.in_transaction:  # inside the service's group commit (app.service.door.writer): a savepoint of its transaction
        with _nested(conn):
            if savepoint is not None:
                _savepoint(conn, savepoint)
            yield conn
        return
    try:
        _begin_immediate(conn)
    except sqlite3.OperationalError as error:
        raise storage_error(_path_of(conn), error) from None
    committed = False
    try:
        if savepoint is not None:
            _savepoint(conn, savepoint)
        yield conn
        conn.execute("COMMIT")
        committed = True
    except sqlite3.OperationalError as error:
        _rollback(conn)
        if _is_storage_fault(error):
            raise storage_error(_path_of(conn), error) from None
        raise
    except BaseException:
        _rollback(conn)
        raise
    finally:
        if (calendar := getattr(conn, "calendar", None)) is not None:
            calendar.ended(committed)  # app.store.bookings.Calendar: what the transaction changed stands, or not


@contextmanager
def _nested(conn: sqlite3.Connection) -> Iterator[None]:
    """A write inside an open transaction: an error rolls back to its savepoint, and only it, and passes through."""
    _savepoint(conn, "nested")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # SQLite may have ended the whole transaction (a full disk): the group sees that
            conn.execute("ROLLBACK TO nested")
            conn.execute("RELEASE nested")
            if (calendar := getattr(conn, "calendar", None)) is not None:
                calendar.rolled_back()  # app.store.bookings.Calendar: read again what this undid
        raise
    conn.execute("RELEASE nested")


def _savepoint(conn: sqlite3.Connection, name: str) -> None:
    conn.execute(f"SAVEPOINT {name}")
    if (calendar := getattr(conn, "calendar", None)) is not None:
        calendar.mark()  # app.store.bookings.Calendar: a ROLLBACK TO it undoes only what changes from here


def _write_pg(conn, cards: tuple[str, ...], user: str | None, savepoint: str | None, own: bool,
              new_booking: bool, reads: tuple[int, int] | None) -> Iterator:
    from app.store.pg import WRITE_LOCK, lock_keys  # start-up: only a PostgreSQL store loads it

    # BEGIN, the locks and the savepoint in one round trip (PgConnection.script): the keys are integers of our own
    # making.
    wanted: list[tuple[int, int]] = []
    if own:
        opening, store_lock = "BEGIN", None
    elif not cards:
        opening, store_lock = f"BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK})", "exclusive"
    else:
        wanted = lock_keys(cards, user)
        kinds, keys = zip(*wanted)
        # unnest yields the keys in the arrays' (sorted) order, and each row takes its lock
        opening = (f"BEGIN; SELECT pg_advisory_xact_lock_shared({WRITE_LOCK});"
                   f" SELECT count(pg_advisory_xact_lock(kind, key)) FROM unnest('{{{','.join(map(str, kinds))}}}'::int4[],"
                   f" '{{{','.join(map(str, keys))}}}'::int4[]) AS wanted(kind, key)")
        store_lock = "shared"
    if savepoint is not None:
        opening += f"; SAVEPOINT {savepoint}"
    if new_booking:
        opening += "; SELECT board_next_booking_id()"  # app.store.pg_schema's _V_BOOKING_IDS
    prefetch = reads is not None and bool(cards) and user is not None
    if prefetch:  # last: the script's last result
        from app.store.bookings import prefetch_sql  # start-up: see above

        opening += "; " + prefetch_sql(conn, cards, user, reads)  # type: ignore[arg-type]
    try:
        results = _lock(conn, opening, wanted, store_lock)
        conn.reserved_booking = results[-1 - prefetch][0][0] if new_booking else None
        if prefetch:
            from app.store.bookings import Prefetched  # start-up: see above

            conn.calendar = Prefetched(conn, reads, cards, user, results[-1])  # type: ignore[arg-type]
        conn.chain_unlocked = bool(cards)
        yield conn
        if cards and not conn.chain_unlocked:  # the chain's lock, deferred by the append, goes with the COMMIT
            from app.store.pg import CHAIN_LOCK  # start-up: see above

            _locking(conn, lambda: conn.execute("COMMIT"), [CHAIN_LOCK], None, conn.short_locks)
        else:
            conn.execute("COMMIT")  # with what was deferred (the booking, its event), in one round trip
    except BaseException:
        _rollback(conn)
        raise
    finally:
        conn.chain_unlocked = False
        conn.reserved_booking = conn.calendar = None  # the locks are gone, and what was read under them with them


def inserted_id(cursor: sqlite3.Cursor) -> int:
    """The id of the row the INSERT on `cursor` added: sqlite3's lastrowid, or the `RETURNING id` that app.store.pg
    adds to an INSERT into one of its _ID_TABLES."""
    row_id = cursor.lastrowid
    assert row_id is not None  # an INSERT that ran: every table the store inserts into numbers its rows
    return row_id


def chain_lock(conn: sqlite3.Connection) -> str | None:
    """Before an append to the audit chain (app.store.events.record): in a PostgreSQL write on named cards, the
    statement that takes the chain's own lock, the last of the write's locks, so that the tail read after it is the
    latest one committed; None when the write holds the chain already (the store's lock, or it was taken)."""
    if not getattr(conn, "chain_unlocked", False):
        return None
    from app.store.pg import CHAIN_LOCK  # start-up: only a PostgreSQL store gets here

    conn.chain_unlocked = False  # type: ignore[attr-defined]
    return f"SELECT pg_advisory_xact_lock({CHAIN_LOCK[0]}, {CHAIN_LOCK[1]})"


def _lock(conn, sql: str, wanted: list[tuple[int, int]], store_lock: str | None = None) -> list[list]:
    """Run `sql` (statements without parameters: PgConnection.script) that takes advisory locks (the two-key ones
    `wanted`, and the store's lock `store_lock`: 'shared', 'exclusive' or None); each statement's rows. A lock still taken
    after the lock timeout: StoreLocked, naming the sessions that hold it (app.store.pg.lock_holders)."""
    from app.store.pg import HELD_LOCK_TIMEOUT_MS  # start-up: only a PostgreSQL store gets here

    locking = bool(wanted or store_lock)
    # Once a lock stayed taken, the next writes wait less for a while: each one waits on the service's one database
    # thread, and its reads and heartbeat wait behind it.
    short = locking and time.monotonic() < conn.held_until
    if short:
        begin = "BEGIN; " if sql.startswith("BEGIN; ") else ""
        sql = f"{begin}SET LOCAL lock_timeout = {HELD_LOCK_TIMEOUT_MS}; {sql.removeprefix(begin)}"
    conn.short_locks = short  # for the transaction (SET LOCAL): the chain's lock, sent later, waits as long
    return _locking(conn, lambda: conn.script(sql), wanted, store_lock, short)


def _locking(conn, run: Callable[[], T], wanted: list[tuple[int, int]], store_lock: str | None, short: bool) -> T:
    """`run()`, which sends statements that take advisory locks (as `_lock`'s); a lock still taken after the lock
    timeout (the short one when `short`): StoreLocked, naming the sessions that hold it."""
    from app.store.pg import HELD_FOR_S, HELD_LOCK_TIMEOUT_MS, LOCK_TIMEOUT_MS, lock_holders  # start-up: see above

    locking = bool(wanted or store_lock)
    try:
        rows = run()
    except sqlite3.OperationalError as error:
        if getattr(error, "sqlstate", None) != "55P03":  # lock_not_available: lock_timeout passed
            raise
    else:
        if locking:
            conn.held_until = 0.0
        return rows
    conn.held_until = time.monotonic() + HELD_FOR_S
    _rollback(conn)  # the transaction failed with the lock: who holds it is read outside it
    try:
        holders = lock_holders(conn, wanted, store_lock)
    except sqlite3.Error:
        holders = []
    said = (f"{', '.join(name for name, _ in holders)} {'holds' if len(holders) == 1 else 'hold'} the lock it needs"
            if holders else "another writer, perhaps on another host, held the lock it needs")
    ending = (f"; a superuser may end that session: SELECT pg_terminate_backend({holders[0][1]})"
              if len(holders) == 1 else "")
    waited = HELD_LOCK_TIMEOUT_MS if short else LOCK_TIMEOUT_MS
    raise StoreLocked(f"the board database stayed locked for {waited / 1000:g} s: {said}; nothing was"
                      f" changed: try again{ending}") from None


def is_postgres(conn) -> bool:
    """Whether `conn` is a PostgreSQL store's (app.store.pg.PgConnection) rather than SQLite's."""
    return getattr(conn, "dialect", "sqlite") == "postgresql"


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open: SQLite ends it by itself after some errors (a full disk). On
    PostgreSQL, what the connection kept of the transaction goes too (PgConnection.forget)."""
    if (forget := getattr(conn, "forget", None)) is not None:
        forget()
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.OperationalError:
            pass  # the error being raised says more than this one


def _begin_immediate(conn: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, waiting up to the busy timeout in short, jittered naps.

    SQLite's own busy handler sleeps 1, 2, 5 ... then 100 ms at a time, so under many writers the
    lock often sits free while every waiter sleeps; short naps hand it on within a millisecond.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    nap = 0.0005
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as error:
                if not _is_busy(error):
                    raise
                if time.monotonic() >= deadline:
                    raise StoreError(f"the board database stayed locked for {BUSY_TIMEOUT_MS / 1000:g} s"
                                     " (someone holds its write lock); try again") from None
            import random  # start-up: only a busy database waits

            time.sleep(random.uniform(nap / 2, nap))
            nap = min(nap * 1.5, 0.005)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


def _is_busy(error: sqlite3.OperationalError) -> bool:
    return "locked" in str(error) or "busy" in str(error)


def data_version(conn: sqlite3.Connection) -> int:
    """Changes whenever another connection commits; cheap enough to poll every second (SQLite only: PostgreSQL's
    changes are NOTIFY'd, app.service.box.watch)."""
    return conn.execute("PRAGMA data_version").fetchone()[0]


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def storage_error(path: Path | PostgresStore, error: BaseException) -> BoardError:
    """The one-line error a user sees for a SQLite failure on the database at `path`.

    A full disk, a read-only database or filesystem, a symlink loop and a damaged file each say so;
    a user outside the board's group is told to ask for membership. When a ROLLBACK failed because
    SQLite had already rolled back (it does after SQLITE_FULL), the cause is the error before it.
    """
    if isinstance(error, BoardError):
        return error
    if isinstance(path, PostgresStore) or getattr(error, "sqlstate", None) is not None:
        return _pg_error(error)
    path = Path(path)
    error = _underlying(error)
    message = str(error)
    name = getattr(error, "sqlite_errorname", "") or ""
    if name.startswith("SQLITE_FULL") or "database or disk is full" in message:
        return StoreError(f"the disk holding the board database {path} is full (database or disk is full);"
                          f" nothing was saved: free space on that filesystem ({_free(path)}) and try again")
    if name.startswith("SQLITE_CORRUPT") or "malformed" in message:
        return StoreError(f"the board database {path} is damaged ({message}): restore it from a backup"
                          " (see docs/service.md, 'Restoring a backup')")
    if name.startswith("SQLITE_NOTADB") or "file is not a database" in message:
        return BadInput(f"{path} is not a usable board database ({message}); set BOARD_DB to the board's"
                        " database, or restore it from a backup")
    if "newer than this board" in message:
        return StoreError(f"{path} is not a usable board database: {message}")
    if isinstance(error, sqlite3.OperationalError):
        return _access_error(path, error)
    return StoreError(f"the board database {path} failed: {message}")


def _pg_error(error: BaseException) -> BoardError:
    message = str(error)
    if getattr(error, "sqlstate", None) == "42501":  # a grant or row-level security: app.store.pg words it
        return NotPermitted(message)
    if "newer than this board" in message:
        return StoreError(f"the board database is not usable: {message}")
    return StoreError(f"the board database failed: {message}")


def _access_error(path: Path, error: sqlite3.OperationalError) -> BoardError:
    message = str(error)
    if "locked" in message or "busy" in message:
        return StoreError(f"the board database {path} stayed locked for {BUSY_TIMEOUT_MS // 1000} s; try again")
    if "unable to open" in message or "readonly" in message or "disk I/O" in message:
        if _loops(path):
            return _loop_error(path)
        if _read_only_filesystem(path):
            return StoreError(f"the board database {path} is on a read-only filesystem, so nothing can be saved:"
                              " ask an admin to remount it read-write, or set BOARD_DB to a writable path")
        if "readonly" in message and _may_write(path):
            return StoreError(f"the board database {path} is read-only (attempt to write a readonly database);"
                              " nothing was saved: ask an admin to run 'board doctor'")
        if "disk I/O" in message and _may_write(path):
            return StoreError(f"the board database {path} could not be written (disk I/O error); nothing was saved:"
                              f" check that disk and its free space ({_free(path)}), then run 'board doctor'")
        # Not yours: on a shared install only the service opens it, and the config should name its socket.
        return NotPermitted(f"no access to the board database {path}: it is the board service's; use it through"
                            " the service ([service] socket in the config, ask an admin) or set BOARD_DB to"
                            " a database of your own")
    return StoreError(f"the board database {path} failed: {message}")


def _is_storage_fault(error: BaseException) -> bool:
    """A write failed because of where the database lives (full, read-only, I/O), not because of the SQL."""
    error = _underlying(error)
    message = str(error)
    return any(mark in message for mark in ("disk is full", "readonly", "disk I/O", "unable to open",
                                            "malformed", "not a database"))


def _underlying(error: BaseException) -> BaseException:
    """The error a failed ROLLBACK hides: 'cannot rollback - no transaction is active' follows SQLite's own rollback."""
    seen = 0
    while "no transaction is active" in str(error) and isinstance(error.__context__, sqlite3.Error) and seen < 5:
        error, seen = error.__context__, seen + 1
    return error


def _path_of(conn: sqlite3.Connection) -> Path:
    path = getattr(conn, "path", None)
    if path is not None:
        return path
    try:  # a connection opened elsewhere: ask SQLite which file it holds
        for _, name, filename in conn.execute("PRAGMA database_list"):
            if name == "main" and filename:
                return Path(filename)
    except sqlite3.Error:
        pass
    return Path("the board database")


def _loops(path: Path) -> bool:
    for candidate in (path, *path.parents):
        try:
            os.stat(candidate)
            return False
        except OSError as error:
            if error.errno == errno.ELOOP:
                return True
    return False


def _loop_error(path: Path) -> StoreError:
    return StoreError(f"{path} is a symbolic link loop (too many levels of symbolic links); nothing was opened:"
                      " remove the symlink, or set BOARD_DB to the real database file")


def _read_only_filesystem(path: Path) -> bool:
    for candidate in (path, path.parent):
        try:
            return bool(os.statvfs(candidate).f_flag & os.ST_RDONLY)
        except OSError:
            continue
    return False


def _may_write(path: Path) -> bool:
    """Whether this user should be able to write the database: root, its owner, or in its group."""
    try:
        info = path.stat()
    except OSError:
        return False
    return os.geteuid() == 0 or info.st_uid == os.geteuid() or info.st_gid in {os.getegid(), *os.getgroups()}


def _free(path: Path) -> str:
    try:
        fs = os.statvfs(path.parent)
    except OSError:
        return "free space unknown"
    return f"{fs.f_bavail * fs.f_frsize // 1024} KiB free"


class MalformedRow(ValueError):
    """A row that a hand edit left undecodable; the message says what is wrong with it."""


def report_malformed(conn: sqlite3.Connection, kind: str, row_id: object, problem: object) -> None:
    """Log 'booking 12 is malformed: ...; skipped' once per row of each database, so one bad row never stops a listing.

    `problem` may quote the row's text, so it is made inert (ASCII, no control characters) and short.
    """
    key = (str(_path_of(conn)), kind, row_id)
    if key in _malformed:
        return
    shown = _inert(str(problem))[:160]
    where = row_id if isinstance(row_id, int) else ascii(row_id)[:40]
    _malformed[key] = line = f"{kind} {where} is malformed: {shown}; skipped (a hand edit? see board doctor)"
    import logging  # start-up: only a malformed row is logged

    logging.getLogger("app.store").warning("%s", line)


def _inert(text: str) -> str:
    """Printable ASCII stays; anything else (escapes, controls, bidi marks) is shown as its Python escape."""
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)


def malformed_rows() -> list[str]:
    """The lines report_malformed has logged in this process, oldest first."""
    return list(_malformed.values())


def need(value: object, kind: type | tuple[type, ...], column: str) -> None:
    """Raise MalformedRow unless `value` is of `kind`; a bool never passes for an int, nor NaN for a float."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) or not isinstance(value, kinds) or (float in kinds and value != value):
        raise MalformedRow(f"{column} is {_describe(value)}")


def need_json_object(value: object, column: str) -> dict:
    """The JSON object stored as text in `column`; MalformedRow when it is not text, not JSON or not an object."""
    if not isinstance(value, str):  # as need(value, str, column) says it
        raise MalformedRow(f"{column} is {_describe(value)}")
    try:
        decoded = json.loads(value)
    except ValueError:
        raise MalformedRow(f"{column} is not JSON ({ascii(value)[:40]})") from None
    if not isinstance(decoded, dict):
        raise MalformedRow(f"{column} is JSON {type(decoded).__name__}, not an object")
    return decoded


def _describe(value: object) -> str:
    if value is None:
        return "NULL"
    text = ascii(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"

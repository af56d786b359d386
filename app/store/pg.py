"""The PostgreSQL store: a psycopg 3 connection that the store's code uses as it uses sqlite3's.

The SQL in app/ is written to run on both (quoted "user", IS DISTINCT FROM, ON CONFLICT, RETURNING); the
translation here is only what cannot be: `?` placeholders become `%s`, `BEGIN IMMEDIATE` becomes `BEGIN`, and an
INSERT into a table with an `id` gets `RETURNING id` so that `lastrowid` works. psycopg's errors surface as
subclasses of sqlite3's, keeping the SQLSTATE, so every `except sqlite3.Error` keeps working. psycopg itself is
imported only when a connection is opened: SQLite users never load it.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import time
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable, Iterator, NamedTuple

from app.errors import BadInput, BoardError
from app.store.pg_schema import PG_LATEST, PG_MIGRATIONS

if TYPE_CHECKING:
    from app.config import PostgresStore

STATEMENT_TIMEOUT_MS = 30_000  # no statement of board's runs for seconds: a hung one must not hold the calendar
IDLE_IN_TRANSACTION_MS = 10_000  # a host that stopped mid-transaction lets go of its locks after this
LOCK_TIMEOUT_MS = 10_000  # a writer waits this long for the write lock, as SQLite's busy timeout (app.store.db.write)
# After a lock stayed taken that long (a compromised host can hold one as long as it likes), a connection's writes wait
# this long at most, for HELD_FOR_S or until one takes its locks: a service's operations run one at a time.
HELD_LOCK_TIMEOUT_MS, HELD_FOR_S = 1_000, 60.0
CONNECT_TIMEOUT_S = 5
WRITE_LOCK = 0x626F617264  # 'board': the advisory lock every write transaction takes (app.store.db.write)
# The two-key advisory locks (a key space apart from WRITE_LOCK's) of a write on named cards: (kind, key).
CARD_LOCK, USER_LOCK = 1, 2  # kinds: a card (its UUID's key), a user (their name's)
CHAIN_LOCK = (3, 0)  # the audit chain's, taken last, right before its append (app.store.db.chain_lock)
CHANNEL = "board_changes"  # NOTIFY'd by the schema's triggers with the kind that changed: bookings, servers, hosts
BACKOFF_MAX_S = 30.0
INSUFFICIENT_PRIVILEGE = "42501"  # a missing grant, or a row that row-level security keeps from this role

# Tables whose rows the database numbers (an identity `id`): an INSERT into one reports it as lastrowid.
_ID_TABLES = {"bookings", "events", "servers", "series", "outbox", "faults", "alerts", "api_keys", "gateway_usage",
              "server_plans"}


# What a server says at connect while it stops or starts (SQLSTATE 57P03) or while it is full (class 53: no connection
# slot left, for everyone, for the role or for the database; no memory or process for one more). libpq gives these only
# as text at connect. Each passes by itself: the database away for now, retried with the backoff, not a refusal to fix.
_NOT_NOW = re.compile(r"the database system is (starting up|shutting down|in recovery mode|not (yet )?accepting)"
                      r"|sorry, too many clients already|remaining connection slots are reserved"
                      r"|too many connections for (role|database)|out of memory"
                      r"|could not fork new process for connection")


class StoreUnreachable(BoardError):
    """The database did not answer; the message names this host, the database's address, and that nothing changed."""


class StoreRefused(BoardError):
    """The database answered but refused the connection (no such role or database, a wrong password)."""


class PgError:
    """Mixed into each mapped error: the SQLSTATE PostgreSQL gave (e.g. 23P01, an exclusion violation)."""

    sqlstate: str | None = None


class PgIntegrityError(PgError, sqlite3.IntegrityError):
    pass


class PgOperationalError(PgError, sqlite3.OperationalError):
    pass


class PgDataError(PgError, sqlite3.DataError):
    pass


class PgProgrammingError(PgError, sqlite3.ProgrammingError):
    pass


class PgDatabaseError(PgError, sqlite3.DatabaseError):
    pass


def _mapped(error: Exception, who: str = "") -> sqlite3.Error:
    """psycopg's error as the sqlite3 error the store's code expects, its SQLSTATE kept; `who` (the role and host)
    goes into a refusal of a privilege or of row-level security (42501), which app.store.db says as not permitted."""
    state = getattr(error, "sqlstate", None) or ""
    kind: type[PgIntegrityError | PgDataError | PgOperationalError | PgDatabaseError]
    if state.startswith("23") or state == "P0001":  # constraints, and the schema's triggers' RAISE (as SQLite's)
        kind = PgIntegrityError
    elif state.startswith("22"):
        kind = PgDataError
    elif state.startswith("42"):
        kind = PgOperationalError  # SQLite says OperationalError for 'no such table' and syntax errors
    elif state.startswith(("40", "53", "55", "57", "08")) or not state:
        kind = PgOperationalError
    else:
        kind = PgDatabaseError
    diag = getattr(error, "diag", None)
    message = (getattr(diag, "message_primary", None) or str(error)).strip().splitlines()[0] if str(error) else state
    hint = getattr(diag, "message_hint", None)  # the schema's own refusals say what to do
    if state == "23P01":  # the bookings' EXCLUDE: said as SQLite's overlap triggers say it
        message = f"overlapping booking ({message})"
    elif state == INSUFFICIENT_PRIVILEGE and who:
        message = f"the board database refused {who}: {message}"
        hint = hint or "a host's role writes only its own host's rows (board doctor shows this host's binding)"
    if hint:
        message = f"{message}; {hint}"
    mapped = kind(message)
    mapped.sqlstate = state or None
    return mapped


# -- the SQL --------------------------------------------------------------------------------------------------


_BARE_USER = re.compile(r'(?<!["\w.])user\b(?!")', re.IGNORECASE)
_INSERT_INTO = re.compile(r"\s*INSERT\s+INTO\s+(\w+)", re.IGNORECASE)


@lru_cache(maxsize=2048)
def translate(sql: str) -> tuple[str, bool]:
    """(the statement for psycopg, whether it returns the new row's id). Cached: the same strings come again."""
    out, quote = [], None
    code = []  # the statement outside string literals, to check
    for char in sql:
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "?":
            out.append("%s")
            code.append(" ")
            continue
        if char == "%":
            out.append("%%")
        else:
            out.append(char)
        if not quote:
            code.append(char)
    text = "".join(out).strip()
    plain = "".join(code)
    # In PostgreSQL a bare `user` is CURRENT_USER: a query would silently read the role's name. Write "user".
    if _BARE_USER.search(plain.replace("'", " ")):
        raise PgProgrammingError(f'bare user in SQL (write "user"): {sql.strip()[:120]}')
    if re.fullmatch(r"BEGIN\s+IMMEDIATE", text, re.IGNORECASE):
        return "BEGIN", False
    match = _INSERT_INTO.match(text)
    returns_id = bool(match and match.group(1).lower() in _ID_TABLES and not re.search(r"\bRETURNING\b", plain, re.I))
    if returns_id:
        text += " RETURNING id"
    return text, returns_id


def _param(value: Any) -> Any:
    # The schema keeps SQLite's integer flags (ok, metrics): a Python bool goes in as 0 or 1, as sqlite3 sends it.
    return int(value) if isinstance(value, bool) else value


def _params(values: Any) -> tuple | dict:
    if values is None:
        return ()
    if isinstance(values, dict):
        raise PgProgrammingError("named parameters are not used by board's SQL")
    return tuple(_param(v) for v in values)


def lock_keys(cards: Iterable[str], user: str | None) -> list[tuple[int, int]]:
    """The (kind, key) advisory locks of a write on `cards` (UUIDs) by `user`, in the one order every writer takes
    them: the cards' sorted by key (two UUIDs that share a key share a lock: they only wait), then the user's."""
    card_keys = sorted({_key(uuid) for uuid in cards})
    return [(CARD_LOCK, key) for key in card_keys] + ([(USER_LOCK, _key(user))] if user is not None else [])


def lock_holders(conn: PgConnection, wanted: Iterable[tuple[int, int]] = (), store_lock: str | None = None
                 ) -> list[tuple[str, int]]:
    """Who holds a lock a write waits for: one of the two-key advisory locks `wanted`, or the store's WRITE_LOCK
    (any hold when wanted 'exclusive', an exclusive one when 'shared'): ('role board_gpu2 (board gpu2, pid 4242)',
    pid), by pid. pg_locks and pg_stat_activity show every role the pid, role and application_name of each session;
    those names are the holder's to choose, so they are shown inert."""
    from app.core.text import inert  # start-up: only a lock that stayed taken gets here

    kinds, keys = zip(*wanted) if wanted else ((), ())
    rows = conn.execute(
        "SELECT DISTINCT l.pid, a.usename, a.application_name FROM pg_locks AS l"
        " LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND ((? = 1 AND l.objsubid = 1 AND l.classid::int8 = ? AND l.objid::int8 = ?"  # flags: 0 or 1 (_param)
        " AND (? = 1 OR l.mode = 'ExclusiveLock'))"
        " OR (l.objsubid = 2 AND (l.classid::int8, l.objid::int8) IN"
        " (SELECT * FROM unnest(?::int8[], ?::int8[]))))"
        " ORDER BY l.pid",
        (store_lock is not None, WRITE_LOCK >> 32, WRITE_LOCK & 0xFFFFFFFF, store_lock == "exclusive",
         list(kinds), [key & 0xFFFFFFFF for key in keys])).fetchall()
    return [(f"role {inert(role or '?', 63)} ({inert(name or '', 63) or 'no application_name'}, pid {pid})", pid)
            for pid, role, name in rows]


def _key(text: str) -> int:
    """A 32-bit key for a name, the same on every host (Python's own hash() is salted per process)."""
    import hashlib  # start-up: only a PostgreSQL store's writes get here

    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big", signed=True)


# -- the connection -------------------------------------------------------------------------------------------


class Cursor:
    """What the store's code reads from sqlite3's cursor: rows, lastrowid, rowcount. A deferred statement's
    (PgConnection.defer) has its psycopg cursor once it was sent."""

    def __init__(self, cursor: Any, lastrowid: int | None = None, rows: list | None = None) -> None:
        self._cursor, self.lastrowid, self._rows = cursor, lastrowid, rows
        self._returns_rows: bool | None = None

    @property
    def sent(self) -> bool:
        """Whether its statement has gone to the database (a deferred one: with the next round trip)."""
        return self._cursor is not None

    def _has_rows(self) -> bool:
        """Whether the statement returned rows; asked once: psycopg builds `description` anew at each look, a column
        object per column, which cost a booking on PostgreSQL a sixth of its time row by row (bench/bench_fleet.py)."""
        if self._returns_rows is None:
            self._returns_rows = self._cursor.description is not None
        return self._returns_rows

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def description(self):
        return self._cursor.description

    def fetchone(self):
        if self._rows is not None:
            return self._rows.pop(0) if self._rows else None
        return self._cursor.fetchone() if self._has_rows() else None

    def fetchall(self) -> list:
        if self._rows is not None:
            rows, self._rows = self._rows, []
            return rows
        return self._cursor.fetchall() if self._has_rows() else []

    def fetchmany(self, size: int = 1) -> list:
        return [row for row in (self.fetchone() for _ in range(size)) if row is not None]

    def __iter__(self) -> Iterator:
        while (row := self.fetchone()) is not None:
            yield row

    def close(self) -> None:
        self._cursor.close()


class PgConnection:
    """One psycopg connection, in autocommit: the store's code runs its own BEGIN/COMMIT (app.store.db.write).

    A connection that broke (the database restarted, the network went) is opened again on the next use outside a
    transaction, at most once per backoff (1 s, doubling to 30 s); meanwhile each use gets StoreUnreachable.
    """

    dialect = "postgresql"
    chain_unlocked = False  # in a write on named cards, until it takes the audit chain's lock (app.store.db)
    held_until = 0.0  # time.monotonic() until which its writes wait HELD_LOCK_TIMEOUT_MS for locks (app.store.db)
    short_locks = False  # the open write waits HELD_LOCK_TIMEOUT_MS for each lock (app.store.db._lock)
    round_trips = 0  # each exchange with the database: a statement, a script, or the deferred ones with the next
    reserved_booking: int | None = None  # a booking id taken with the write's locks, for its insert (app.store.db)
    cards_seen: dict[str, tuple] | None = None  # the cards table as last read unchanged (app.store.bookings.sync_cards)
    calendar: Any = None  # within a write on named cards, its cards' and user's bookings (app.store.bookings.Prefetched)

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.path = store.url  # what an error names (app.store.db.storage_error)
        self._deferred: list[tuple[str, tuple | dict, Cursor]] = []
        self.made: dict[int, Cursor] = {}  # a booking inserted in this write -> its row's read, sent with the insert
        self._conn: Any = None
        self._retry_at = 0.0
        self._backoff = 1.0
        self._why: str | None = None  # what the server said when it last turned a connection away for now
        self._open()

    # -- opening, and opening again ----------------------------------------------------------------------

    def _open(self) -> None:
        import psycopg  # start-up: only a PostgreSQL store loads the driver

        password = _password(self.store.password_file)
        given: dict[str, Any] = {"password": password} if password is not None else {}
        try:
            conn = psycopg.connect(self.store.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                   application_name=f"board {self.store.host}"[:63], **given)
        except psycopg.OperationalError as error:
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
            said = re.search(r"FATAL:\s*(.*)", str(error))
            if said and not _NOT_NOW.search(said.group(1)):  # it refused: a role, a password, a database to fix
                raise StoreRefused(f"the board database at {_address(self.store.url)} refused {self.store.host}:"
                                   f" {said.group(1).strip()}; check [storage] url and the role's access") from None
            self._why = said.group(1).strip() if said else None
            raise self.unreachable() from None
        _adapt(conn)
        conn.execute(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
        conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_MS}")
        conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        conn.execute("SET synchronous_commit = on")  # nothing acknowledged is lost, whatever the server's default
        conn.execute("SET TIME ZONE 'UTC'")
        self._conn, self._backoff, self._why = conn, 1.0, None

    def unreachable(self) -> StoreUnreachable:
        where = _address(self.store.url) + (f": {self._why}" if self._why else "")
        return StoreUnreachable(f"the board database is unreachable ({self.store.host} → {where}); nothing was changed")

    def _live(self) -> Any:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None and conn.broken and self._in_transaction(conn):
            raise self.unreachable()
        if time.monotonic() < self._retry_at:
            raise self.unreachable()
        self._conn = None
        self._open()
        return self._conn

    # -- what sqlite3.Connection offers ------------------------------------------------------------------

    def execute(self, sql: str, params: Iterable | None = None) -> Cursor:
        text, returns_id = translate(sql)
        if self.made and not self.in_transaction:
            self.made = {}  # read back for the write that made them; anything sent after it may change them
        if self._deferred:  # they go first, in the same round trip
            cursor = self._send([(text, _params(params), None)])[0]
        else:
            conn = self._live()
            self.round_trips += 1
            with self._errors(conn):
                cursor = conn.execute(text, _params(params))
        if returns_id:
            row = cursor.fetchone()
            return Cursor(cursor, row[0] if row else None, rows=[])
        return Cursor(cursor)

    def defer(self, sql: str, params: Iterable | None = None) -> Cursor:
        """Queue a statement inside a transaction: it goes with the next round trip (the next statement, or the
        COMMIT), in order, pipelined; an error it meets is raised there. Its cursor answers once it was sent."""
        text, _ = translate(sql)
        cursor = Cursor(None)
        self._deferred.append((text, _params(params), cursor))
        return cursor

    def _send(self, last: list[tuple[str, tuple | dict, Cursor | None]]) -> list[Any]:
        """The deferred statements and `last`, in one round trip (psycopg's pipeline mode); `last`'s cursors."""
        queued, self._deferred = self._deferred, []
        conn = self._live()
        self.round_trips += 1
        sent = []
        with self._errors(conn), conn.pipeline():
            for text, params, cursor in [*queued, *last]:
                raw = conn.execute(text, params)
                if cursor is not None:
                    cursor._cursor = raw
                sent.append(raw)
        return sent[len(queued):]

    def executemany(self, sql: str, seq: Iterable[Iterable]) -> Cursor:
        text, returns_id = translate(sql)
        if returns_id:
            text = text.removesuffix(" RETURNING id")
        rows = [_params(p) for p in seq]
        if rows and self._deferred:
            self._send([])
        conn = self._live()
        cursor = conn.cursor()
        if rows:
            self.round_trips += 1  # pipelined by psycopg: one round trip
            with self._errors(conn):
                cursor.executemany(text, rows)
        return Cursor(cursor, rows=[])

    def script(self, sql: str) -> list[list]:
        """Several statements without parameters, `;`-separated, in one round trip (the simple query protocol: each
        still runs on its own snapshot); each one's rows."""
        if self._deferred:
            self._send([])
        conn = self._live()
        self.round_trips += 1
        results = []
        with self._errors(conn):
            cursor = conn.execute(sql)
            while True:
                results.append(cursor.fetchall() if cursor.description is not None else [])
                if not cursor.nextset():
                    return results

    def quote(self, value: Any) -> str:
        """`value` as an SQL literal, quoted by the driver, for a script (which takes no parameters)."""
        from psycopg import sql  # start-up: loaded by _open already

        return sql.Literal(value).as_string(self._live())

    @contextmanager
    def _errors(self, conn: Any) -> Iterator[None]:
        """psycopg's errors as sqlite3's (_mapped); a connection that broke meanwhile is the unreachable line."""
        import psycopg  # start-up: loaded by _open already

        try:
            yield
        except psycopg.OperationalError as error:
            if conn.broken:
                raise self.unreachable() from None
            raise _mapped(error) from None
        except psycopg.Error as error:
            raise _mapped(error, self.who) from None

    @property
    def who(self) -> str:
        """This connection's role and host, for a refusal: 'role board_gpu2 (host gpu2)'."""
        user = self._conn.info.user if self._conn is not None and not self._conn.closed else "?"
        return f"role {user} (host {self.store.host})"

    @property
    def in_transaction(self) -> bool:
        return self._conn is not None and not self._conn.closed and self._in_transaction(self._conn)

    @staticmethod
    def _in_transaction(conn: Any) -> bool:
        from psycopg import pq  # start-up: loaded by _open already

        return conn.info.transaction_status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR,
                                                pq.TransactionStatus.ACTIVE)

    def commit(self) -> None:
        if self.in_transaction:
            self.execute("COMMIT")

    def rollback(self) -> None:
        self.forget()
        if self.in_transaction:
            self.execute("ROLLBACK")

    def forget(self) -> None:
        """What this connection keeps of the open transaction, which a rollback undoes: the statements not sent yet
        (never sent: nothing to undo), the rows it read back, the cards it saw."""
        self._deferred, self.made, self.cards_seen, self.reserved_booking = [], {}, None, None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def fileno(self) -> int:
        """The socket, to wait on for NOTIFY (app.service.box.watch)."""
        return self._live().fileno()

    @property
    def raw(self) -> Any:
        """The psycopg connection itself (LISTEN/NOTIFY)."""
        return self._live()

    def __enter__(self) -> PgConnection:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        """As sqlite3's: commit an open transaction, or roll it back after an error; the connection stays open."""
        if kind is None:
            self.commit()
        else:
            self.rollback()


def connect(store: PostgresStore) -> PgConnection:
    """Open the board's PostgreSQL database, creating its schema on first use (app.store.pg_schema) when this role
    owns it, and refusing, in one line, a role that row-level security binds to another host or to none."""
    conn = PgConnection(store)
    try:
        ensure_schema(conn)
        check_binding(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def ensure_schema(conn: PgConnection) -> None:
    """Bring the database's schema to PG_LATEST; a no-op read when it is there. Refuses a newer one in one line, and
    says who may make or upgrade it when this role may not (only the tables' owner may: docs/fleet.md)."""
    import psycopg  # start-up: loaded by the connection already

    raw = conn.raw
    version = None
    try:
        version = _schema_version(raw)
        if version == PG_LATEST:
            return
        with raw.transaction():
            raw.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            apply_migrations(raw)
    except psycopg.errors.InsufficientPrivilege:
        refused = PgOperationalError(
            f"the board's schema in {where(conn.store.url)} is {f'version {version}' if version else 'not made yet'},"
            f" this board's is version {PG_LATEST}, and {conn.who} may not make or change it: only the tables' owner"
            " may: run board migrate --schema-only --to URL as the owner (docs/fleet.md)")
        refused.sqlstate = INSUFFICIENT_PRIVILEGE
        raise refused from None
    except psycopg.Error as error:
        raise _mapped(error) from None


class Binding(NamedTuple):
    """Whom row-level security holds this connection's role to: `host` (fleet_roles), or nobody (`unbound_by`
    says why: a superuser, BYPASSRLS, a member of the tables' owner; '' when RLS binds it)."""

    role: str
    host: str | None
    unbound_by: str


def binding(conn: PgConnection) -> Binding:
    """This role's host in fleet_roles, and whether row-level security binds the role at all (it does not bind the
    tables' owner, a member of it, which may act as it, nor a superuser or a BYPASSRLS role)."""
    role, superuser, bypass, owner, member, host = conn.execute(
        "SELECT current_user, r.rolsuper, r.rolbypassrls, pg_get_userbyid(c.relowner),"
        " pg_has_role(current_user, c.relowner, 'MEMBER'),"
        " (SELECT f.host FROM fleet_roles AS f WHERE f.role = current_user)"
        " FROM pg_roles AS r, pg_class AS c WHERE r.rolname = current_user AND c.oid = 'cards'::regclass").fetchone()
    unbound_by = ("a superuser" if superuser else "BYPASSRLS" if bypass
                  else ("the tables' owner" if role == owner else f"a member of {owner}, which owns the tables")
                  if member else "")
    return Binding(role, host, unbound_by)


def check_binding(conn: PgConnection) -> None:
    """Refuse (one line, 42501: not permitted) a role that row-level security binds to another host than this one's
    [fleet] host, or to none: its service could write none of this host's rows. The owner and superusers pass."""
    bound = binding(conn)
    if bound.unbound_by or bound.host == conn.store.host:
        return
    fix = (f"UPDATE fleet_roles SET host = '{conn.store.host}' WHERE role = '{bound.role}'" if bound.host
           else f"INSERT INTO fleet_roles (role, host) VALUES ('{bound.role}', '{conn.store.host}')")
    said = f"bound to host {bound.host}" if bound.host else "bound to no host"
    refused = PgOperationalError(
        f"role {bound.role} is {said} in the board database, but this host is {conn.store.host} ([fleet] host):"
        f" as the tables' owner, {fix} (docs/fleet.md)")
    refused.sqlstate = INSUFFICIENT_PRIVILEGE
    raise refused


def apply_migrations(raw: Any) -> None:
    """Run the migrations past the database's version, in the caller's transaction (which holds WRITE_LOCK)."""
    raw.execute("CREATE TABLE IF NOT EXISTS board_schema (version INTEGER NOT NULL)")
    for script in PG_MIGRATIONS[_schema_version(raw):]:
        raw.execute(script)
    raw.execute("DELETE FROM board_schema")
    raw.execute("INSERT INTO board_schema (version) VALUES (%s)", (PG_LATEST,))


def _schema_version(raw: Any) -> int:
    if not raw.execute("SELECT to_regclass('board_schema') IS NOT NULL").fetchone()[0]:
        return 0
    version = raw.execute("SELECT max(version) FROM board_schema").fetchone()[0] or 0
    if version > PG_LATEST:
        raise PgDatabaseError(f"the database has schema version {version}, newer than this board ({PG_LATEST});"
                              " upgrade board")
    return version


def clock_offset(conn: PgConnection) -> float:
    """This host's clock minus the database's now(), in seconds, halving the round trip (for board doctor)."""
    before = time.time()
    (theirs,) = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    after = time.time()
    return (before + after) / 2 - float(theirs)


# -- details --------------------------------------------------------------------------------------------------


def _adapt(conn: Any) -> None:
    """Read numeric (sum() over bigint, avg()) as int or float, as SQLite gives them, never Decimal."""
    from psycopg.adapt import Loader  # start-up: loaded by _open already

    class NumberLoader(Loader):
        def load(self, data: Any) -> int | float:
            text = bytes(data).decode()
            try:
                return int(text)
            except ValueError:
                return float(text)

    conn.adapters.register_loader("numeric", NumberLoader)


def _password(path: os.PathLike | None) -> str | None:
    """The password in [storage] password_file: the reader's own file, readable by no one else, else one line."""
    if path is None:
        return None
    try:
        info = os.stat(path)
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise BadInput(f"can't read [storage] password_file {path} ({error.strerror})") from None
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise BadInput(f"[storage] password_file {path} must be owned by this user (uid {os.geteuid()}) and readable"
                       f" by no one else (mode 0600 or 0400; it is {stat.S_IMODE(info.st_mode):04o}): chmod 600 {path}")
    return text.strip()


def where(url: str) -> str:
    """host:port/dbname of a libpq URI, for people (a password in it is never shown)."""
    from psycopg.conninfo import conninfo_to_dict  # start-up: only board migrate and doctor load the driver

    return f"{_address(url)}/{conninfo_to_dict(url).get('dbname', '?')}"


def board_tables(conn) -> list[str]:
    """The board's tables in a PostgreSQL database (app.store.pg's connection), by name."""
    return [row[0] for row in conn.execute(  # pg_tables, not information_schema: it lists what a role may not use too
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename != 'board_schema'"
        " ORDER BY tablename")]


def _address(url: str) -> str:
    """host:port of a libpq URI, for people: a socket directory or a name, and the port (5432 if not given)."""
    try:
        from psycopg.conninfo import conninfo_to_dict  # start-up: loaded by _open already

        info = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - a URI psycopg cannot parse still gets its line
        return "?"
    host = str(info.get("host") or "/var/run/postgresql")
    return f"{host}:{info.get('port') or 5432}"

"""Connections to the one shared SQLite file: WAL, a long busy timeout, foreign keys, short IMMEDIATE writes."""

from __future__ import annotations

import grp
import os
import random
import sqlite3
import stat
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from app.errors import BoardError, NotPermitted
from app.store import schema
from app.store.filesystem import network_filesystem

BUSY_TIMEOUT_MS = 10_000


class StoreError(BoardError):
    """The database cannot be used; the message says what to do."""


def connect(path: Path, *, create: bool = True) -> sqlite3.Connection:
    """Open the board database, creating and migrating it on first use."""
    path = Path(path)
    try:
        kind = network_filesystem(path)
        exists = path.exists()
    except PermissionError:  # a directory we may not search: the 2770 board directory, to a non-member
        raise _access_error(path, sqlite3.OperationalError("unable to open database file")) from None
    if kind:
        raise StoreError(
            f"{path} is on a {kind} filesystem; SQLite's WAL needs a local disk: set BOARD_DB to a local path"
        )
    if not exists and not create:
        raise StoreError(f"no board database at {path}; run 'board init' or set BOARD_DB")
    if not exists and not path.parent.is_dir():
        raise StoreError(f"the directory {path.parent} does not exist; run 'board init --group G' or set BOARD_DB")
    try:
        conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=True)
        # A hand-edited row with bytes that are not UTF-8 must not crash every reader (doctor shows the edit).
        conn.text_factory = _decode_text
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys = ON")
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # durable enough in WAL; fsyncs at checkpoints
        if not exists and _setgid_dir(path.parent):
            os.chmod(path, 0o660)
        if conn.execute("PRAGMA user_version").fetchone()[0] != schema.LATEST:
            schema.migrate(conn)
    except sqlite3.OperationalError as error:
        raise _access_error(path, error) from None
    except sqlite3.DatabaseError as error:
        raise StoreError(f"{path} is not a usable board database: {error}") from None
    return conn


@contextmanager
def write(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One short write transaction: BEGIN IMMEDIATE takes the write lock up front, so checks and writes agree."""
    _begin_immediate(conn)
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


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
            time.sleep(random.uniform(nap / 2, nap))
            nap = min(nap * 1.5, 0.005)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


def _is_busy(error: sqlite3.OperationalError) -> bool:
    return "locked" in str(error) or "busy" in str(error)


def data_version(conn: sqlite3.Connection) -> int:
    """Changes whenever another connection commits; cheap enough to poll every second."""
    return conn.execute("PRAGMA data_version").fetchone()[0]


def _decode_text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _setgid_dir(directory: Path) -> bool:
    return bool(directory.stat().st_mode & stat.S_ISGID)


def _access_error(path: Path, error: sqlite3.OperationalError) -> BoardError:
    message = str(error)
    if "locked" in message or "busy" in message:
        return StoreError(f"the board database {path} stayed locked for {BUSY_TIMEOUT_MS // 1000} s; try again")
    if "unable to open" in message or "readonly" in message or "disk I/O" in message:
        try:
            group = grp.getgrgid(path.parent.stat().st_gid).gr_name
        except (KeyError, OSError):
            group = "the board group"
        if group == "root":  # a broken setup, not a missing membership
            return NotPermitted(f"no access to the board database {path}; its directory has group root:"
                                " ask an admin to run 'board init --group G' again and then 'board doctor'")
        return NotPermitted(f"no access to the board database {path}; ask an admin to add you to group {group}")
    return StoreError(f"the board database {path} failed: {message}")

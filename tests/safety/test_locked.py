"""A write lock someone else holds (a member's sqlite3 shell in BEGIN IMMEDIATE) gives one line, not a traceback."""

from __future__ import annotations

import sqlite3
import threading
import time

import app.store.db as db
from app.cli import main
from app.store.db import connect, write


def test_a_held_write_lock_gives_one_line_after_the_timeout(tmp_path, monkeypatch, capsys):
    path = tmp_path / "board.db"
    connect(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(db, "BUSY_TIMEOUT_MS", 300)
    monkeypatch.setenv("BOARD_DB", str(path))
    monkeypatch.setenv("BOARD_SIMULATE", "1")
    try:
        started = time.monotonic()
        code = main(["book", "1", "--for", "1h"])
        waited = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.splitlines() == ["board: the board database stayed locked for 0.3 s (someone holds its write lock); try again"]
    assert 0.25 < waited < 5


def test_a_writer_gets_the_lock_soon_after_it_is_released(tmp_path):
    path = tmp_path / "board.db"
    connect(path).close()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.2, lambda: holder.execute("COMMIT")).start()
    conn = connect(path)
    try:
        started = time.monotonic()
        with write(conn):
            waited = time.monotonic() - started
        assert 0.15 < waited < 0.3  # short naps: no 100 ms sleeps after the lock comes free
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == db.BUSY_TIMEOUT_MS
    finally:
        conn.close()
        holder.close()

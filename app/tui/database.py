"""The UI's SQLite work, on one dedicated thread with its own connection; the UI awaits the results.

sqlite3 connections are bound to the thread that made them, and a write can wait on another
process's lock for seconds (busy_timeout), so no query or write ever runs on the UI thread.
The board has three connections: this one (user actions, form validation, admin lists), the
bookings poller's (data_version) in app.tui.pollers, and none on the UI thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, TypeVar

from app.store.db import connect

T = TypeVar("T")


class ActionDatabase:
    def __init__(self, db_path: Path) -> None:
        self.db_path = Path(db_path)
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="board-db")

    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect(self.db_path)
        return conn

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return fn(self._connection())

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run fn(conn) on the database thread; exceptions (BadInput, Conflict, ...) come back to the caller."""
        return await asyncio.wrap_future(self._executor.submit(self._run, fn))

    def close(self) -> None:
        def close_conn() -> None:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None

        try:
            self._executor.submit(close_conn)
        except RuntimeError:  # already shut down
            return
        self._executor.shutdown(wait=False)

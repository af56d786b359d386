"""The database thread behind the socket: every operation runs on it, one at a time, in arrival order; bookings that
wait together on a SQLite store share one transaction (group commit).

On SQLite the service is the only writer of its store, so BEGIN IMMEDIATE never waits on anyone; what a booking costs
beside its rules is its transaction: the lock, and the pages its commit writes to the WAL. When several `book`
requests wait at the head of the queue, the thread takes them together (at most MAX_GROUP) in one BEGIN IMMEDIATE ...
COMMIT. Each still runs through Service.call, as alone: its own savepoint (app.store.db.write nests), its own audit
event, its own refusal, and a refusal rolls back to its own savepoint only, never its neighbours. Answers go out only
after the COMMIT. When the group's transaction fails as a whole (its COMMIT, or SQLite ending it after a full disk),
nothing of it was saved, and each request runs again on its own, as if it had come alone.

Not on PostgreSQL: there a booking on named cards locks only them (app.store.db.write), in one order, and holding the
locks of several bookings until one commit would break that order across them.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable

from app.config import PostgresStore
from app.core.identity import Identity
from app.store.db import write

if TYPE_CHECKING:
    from app.service import Service

GROUPED = frozenset({"book"})  # the load path: many members booking at once
MAX_GROUP = 32


class _Task:
    __slots__ = ("future", "fn", "args", "grouped")

    def __init__(self, fn: Callable[..., Any], args: tuple, grouped: bool) -> None:
        self.future: Future = Future()
        self.fn, self.args, self.grouped = fn, args, grouped

    def run(self) -> tuple[Any, BaseException | None]:
        try:
            return self.fn(*self.args), None
        except BaseException as error:  # noqa: BLE001 - handed to whoever waits on the future
            return None, error

    def settle(self, outcome: tuple[Any, BaseException | None]) -> None:
        result, error = outcome
        if error is None:
            self.future.set_result(result)
        else:
            self.future.set_exception(error)


class _Ended(Exception):
    """SQLite ended the group's transaction by itself (after a full disk): none of the group stands."""


class DatabaseThread:
    """One thread for every database operation of the service (its connection is that thread's)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._queue: deque[_Task] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._stopping = False
        self._grouping = not isinstance(service.config.store, PostgresStore)
        self._thread = threading.Thread(target=self._run, name="board-db", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Run `fn(*args)` on the database thread, after everything queued before it."""
        return self._put(_Task(fn, args, False))

    def call(self, me: Identity, op: Any, args: Any) -> Future:
        """Service.call on the database thread; a `book` may share its transaction with others waiting beside it."""
        return self._put(_Task(self.service.call, (me, op, args), isinstance(op, str) and op in GROUPED))

    def shutdown(self, wait: bool = True) -> None:
        """Run what is queued, then stop."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        if wait:
            self._thread.join()

    def _put(self, task: _Task) -> Future:
        with self._ready:
            if self._stopping:
                raise RuntimeError("the database thread has stopped")
            self._queue.append(task)
            self._ready.notify()
        return task.future

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stopping:
                    self._ready.wait()
                if not self._queue:
                    return
                batch = [self._queue.popleft()]
                if batch[0].grouped and self._grouping:
                    while self._queue and self._queue[0].grouped and len(batch) < MAX_GROUP:
                        batch.append(self._queue.popleft())
            if len(batch) == 1:
                batch[0].settle(batch[0].run())
            else:
                self._group(batch)

    def _group(self, batch: list[_Task]) -> None:
        conn = self.service.conn
        outcomes: list[tuple[Any, BaseException | None]] = []
        try:
            with write(conn):
                for task in batch:
                    outcomes.append(task.run())
                    if not conn.in_transaction:
                        raise _Ended()
        except Exception as error:  # noqa: BLE001 - the group as a whole: settled below
            if not outcomes:  # BEGIN failed: each would fail alike
                outcomes = [(None, error)] * len(batch)
            else:  # nothing of the group was saved: each runs again on its own
                outcomes = [task.run() for task in batch]
        for task, outcome in zip(batch, outcomes):
            task.settle(outcome)

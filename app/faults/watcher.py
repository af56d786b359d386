"""The service's fault watcher: Xid events as the driver reports them, throttling spells from the fleet's readings.

Its own daemon thread with its own board.db connection. Each turn waits up to `wait_s` on the GPU source's events
(NVML's event set, or the simulated scenario's), so stopping takes at most that long; every `observe_s` it looks at
the newest fleet snapshot for thermal throttling. Each turn's faults are one short write transaction.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.faults import store
from app.faults.oom import oom_line
from app.faults.throttle import Spell, ThrottleTracker
from app.faults.xid import meaning
from app.gpu.fleet import Fleet
from app.gpu.model import GpuEvent
from app.store import bookings as booking_rows
from app.store.db import connect, write

if TYPE_CHECKING:
    from app.config import PostgresStore

WAIT_S = 0.5
OBSERVE_S = 5.0


def holder_at(conn, card_uuid: str | None, ts: float) -> tuple[int | None, str | None]:
    """(booking id, user) of the live booking on that card at `ts`, or (None, None)."""
    if card_uuid is None:
        return None, None
    for booking in booking_rows.live_between(conn, int(ts), int(ts) + 1):
        if card_uuid in booking.card_uuids:
            return booking.id, booking.user
    return None, None


def record_all(conn, events: Iterable[GpuEvent] = (), spells: Iterable[Spell] = ()) -> list[int]:
    """Write the events and spells as faults, with the booking that held the card then; their ids."""
    rows: list[dict[str, Any]] = []  # store.record's keywords
    for event in events:
        if event.kind == "xid":
            rows.append(dict(ts=event.ts, kind="xid", card_uuid=event.uuid, code=event.code,
                             detail=f"Xid {event.code}: {meaning(event.code)}"))
        elif event.kind == "oom":
            rows.append(dict(ts=event.ts, kind="oom", card_uuid=event.uuid, detail=oom_line([event.detail]) or event.detail))
    for spell in spells:
        rows.append(dict(ts=spell.started, kind="throttle", card_uuid=spell.card_uuid, detail=spell.detail,
                         duration_s=round(spell.duration_s, 1)))
    if not rows:
        return []
    ids = []
    with write(conn):
        for row in rows:
            booking_id, user = holder_at(conn, row["card_uuid"], row["ts"])
            ids.append(store.record(conn, booking_id=booking_id, user=user, **row))
    return ids


class FaultWatcher:
    """`run(stop)` is the loop; `step` is one turn and `close` records the spells still on, for tests with a clock."""

    def __init__(self, fleet: Fleet, db_path: Path | PostgresStore, clock: Callable[[], float], *,
                 log: Callable[[str], None] = print, wait_s: float = WAIT_S, observe_s: float = OBSERVE_S) -> None:
        self.fleet, self.db_path, self.clock = fleet, db_path, clock
        self.log, self.wait_s, self.observe_s = log, wait_s, observe_s
        self.tracker = ThrottleTracker()
        self._observed_at = float("-inf")
        self._seen: float | None = None  # the snapshot last looked at: one reading is one observation
        self._conn: sqlite3.Connection | None = None

    @property
    def conn(self) -> sqlite3.Connection:
        """The watcher's own connection to board.db: opened by the thread that watches."""
        if self._conn is None:
            self._conn = connect(self.db_path)
        return self._conn

    def step(self, wait_s: float | None = None) -> list[int]:
        source = self.fleet.source
        wait = getattr(source, "events", None)  # a source without events (an old fake) has only throttling
        events = wait(self.wait_s if wait_s is None else wait_s) if wait is not None else []
        spells: list[Spell] = []
        now = self.clock()
        if now - self._observed_at >= self.observe_s:
            self._observed_at = now
            snapshot = self.fleet.latest()
            if snapshot.taken_at != self._seen:
                self._seen = snapshot.taken_at
                spells = self.tracker.observe(snapshot)
        return record_all(self.conn, events, spells)

    def close(self) -> list[int]:
        return record_all(self.conn, spells=self.tracker.close(self.clock()))

    def run(self, stop: threading.Event) -> None:
        failing = None  # the last failure logged: a locked or full database says so once, not every turn
        try:
            while not stop.is_set():
                try:
                    self.step()
                except Exception as error:  # noqa: BLE001 - the service outlives one bad turn
                    line = f"faults: {type(error).__name__}: {error}"
                    if line != failing:
                        self.log(line)
                    failing = line
                    stop.wait(self.wait_s)
                else:
                    failing = None
            try:
                self.close()
            except Exception as error:  # noqa: BLE001 - stopping must not fail
                self.log(f"faults: at shutdown: {type(error).__name__}: {error}")
        finally:
            if self._conn is not None:
                self._conn.close()


def start_watcher(fleet: Fleet, db_path: Path | PostgresStore, clock: Callable[[], float], *,
                  log: Callable[[str], None] = print) -> tuple[threading.Event, threading.Thread]:
    """Start the watcher thread; set the event and join the thread to stop it (it records open spells first)."""
    stop = threading.Event()
    thread = threading.Thread(target=FaultWatcher(fleet, db_path, clock, log=log).run, args=(stop,),
                              name="board-faults", daemon=True)
    thread.start()
    return stop, thread

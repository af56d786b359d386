"""The two polling loops. Each runs on its own daemon thread and never overlaps itself.

Telemetry: read the GPU source, post a frozen `TelemetryRead`, wait for the refresh period
(or a wake-up), repeat. A stalled driver stalls only this thread; the UI keeps handling keys.

Bookings: on its own SQLite connection, poll `PRAGMA data_version` once a second (outside any
transaction, autocommit) and reload when another connection committed, when the timeline asks
for another window, or every 30 s; post a frozen `BookingsLoaded`.

Both are the memray pattern: the UI only sets a `threading.Event` to wake a loop early.
They are plain daemon threads rather than Textual thread workers on purpose: Textual runs
thread workers on asyncio's default executor, which is joined at exit, so a driver call hung
for minutes (a GPU off the bus) would make `q` hang too. A daemon thread is simply abandoned.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from app.gpu import GpuSource
from app.gpu.model import FleetSnapshot
from app.store import bookings as rows
from app.store.db import connect, data_version
from app.tui.messages import BookingsLoaded, BookingView, DatabaseFailed, TelemetryFailed, TelemetryRead

DB_POLL_SECONDS = 1.0  # PRODUCT.md: about once a second; a change shows within 2 s
DB_RELOAD_SECONDS = 30.0
FOREVER = 2**62
HISTORY_SECONDS = 600


def simulated_history(source: GpuSource, now: float, step: float) -> list[FleetSnapshot]:
    """The last ten minutes of a simulated fleet, which is a pure function of the clock; [] for real GPUs."""
    scenario = getattr(source, "scenario", None)
    if not source.simulated or scenario is None:
        return []
    from app.gpu.simulated import SimulatedSource

    moment = [now - HISTORY_SECONDS]
    replay = SimulatedSource(replace(scenario, stall_seconds=0.0), clock=lambda: moment[0])
    samples = []
    while moment[0] < now:
        samples.append(replay.read())
        moment[0] += step
    return samples


class Poller:
    """One loop on one daemon thread; `wake()` runs the next round now, `stop()` ends it."""

    def __init__(self, name: str, loop: Callable[["Poller"], None]) -> None:
        self.name = name
        self.stopped = threading.Event()
        self.woken = threading.Event()
        self._thread = threading.Thread(target=loop, args=(self,), name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self.woken.set()

    def stop(self) -> None:
        self.stopped.set()
        self.woken.set()

    def wait(self, seconds: float) -> None:
        self.woken.wait(seconds)
        self.woken.clear()

    @property
    def is_cancelled(self) -> bool:
        return self.stopped.is_set()


def telemetry_loop(
    app, source: GpuSource, refresh: Callable[[], float], worker: Poller, history_step: float = 5.0
) -> None:
    first = True
    while not worker.is_cancelled:
        started = time.monotonic()
        try:
            snapshot = source.read()
        except Exception as error:  # noqa: BLE001 - a driver hiccup must not end the board
            app.post_message(TelemetryFailed(f"{type(error).__name__}: {error}"))
        else:
            if worker.is_cancelled:
                return
            history = tuple(simulated_history(source, snapshot.taken_at, history_step)) if first else ()
            first = False
            app.post_message(TelemetryRead(snapshot, history))
        worker.wait(max(0.05, refresh() - (time.monotonic() - started)))


def bookings_loop(
    app,
    db_path: Path,
    clock: Callable[[], float],
    window: Callable[[], tuple[int, int]],
    worker: Poller,
) -> None:
    try:
        conn = connect(db_path)
    except Exception as error:  # noqa: BLE001 - shown in the board, which keeps the telemetry going
        app.post_message(DatabaseFailed(str(error)))
        return
    try:
        seen: tuple | None = None
        loaded = 0.0
        while not worker.is_cancelled:
            try:
                version = data_version(conn)
                start, end = window()
                key = (version, start, end)
                if key != seen or time.monotonic() - loaded > DB_RELOAD_SECONDS:
                    now = clock()
                    upcoming = rows.live_between(conn, int(now), FOREVER)
                    in_window = rows.live_between(conn, start, end)
                    seen, loaded = key, time.monotonic()
                    if worker.is_cancelled:
                        return
                    app.post_message(BookingsLoaded(BookingView(
                        version, tuple(upcoming), tuple(in_window), start, end, now)))
            except Exception as error:  # noqa: BLE001 - e.g. locked for longer than busy_timeout
                app.post_message(DatabaseFailed(f"{error}"))
            worker.wait(DB_POLL_SECONDS)
    finally:
        conn.close()

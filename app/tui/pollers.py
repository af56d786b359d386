"""The board's three loops, each on its own daemon thread, never overlapping itself.

Events: one subscription to the service (bookings, fleet, servers, notice). A fleet event is
posted as a frozen `TelemetryRead`; a bookings event wakes the loader. The service reads the
GPUs once for every board and pushes each change, so the board neither reads NVML nor polls
SQLite itself.

Bookings: load the live bookings and the timeline's window through the client when the
service says they changed, when the timeline asks for another window, or every 30 s; post a
frozen `BookingsLoaded`.

Servers: load the servers (`serve_list`) and the tokens/s of ready ones that serve /metrics when
the service says servers or bookings changed (in file mode the user's own supervisors write the
file, which arrives as a bookings change), every 2 s while one meters, else every 30 s; post a
frozen `ServersLoaded`. No enforcement here: booking ends are the service's.

They are plain daemon threads rather than Textual thread workers on purpose: Textual runs
thread workers on asyncio's default executor, which is joined at exit, so a call hung for
minutes would make `q` hang too. A daemon thread is simply abandoned.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from app.errors import BoardError
from app.gpu.model import hosts_from_wire, snapshot_from_wire
from app.model import booking_from_wire
from app.tui.messages import (
    BookingsLoaded,
    BookingView,
    DatabaseFailed,
    Notice,
    ServerLine,
    ServersChanged,
    ServersLoaded,
    ServersView,
    TelemetryFailed,
    TelemetryRead,
)

DB_RELOAD_SECONDS = 30.0
HISTORY_SECONDS = 600
FIRST_PAINT_WAIT_SECONDS = 5.0  # the most the history waits for the first paint (a board too busy to paint)
KINDS = ("bookings", "fleet", "servers", "notice")
SERVERS_RELOAD_SECONDS = 30.0
METRICS_SECONDS = 2.0  # tokens/s is a rate between two /metrics reads
RECENT_SECONDS = 24 * 3600  # servers that ended this long ago still show


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


def events_loop(app, client, bookings: "Poller", worker: "Poller", history_step: float = 5.0) -> None:
    """Follow the service's events until stopped; a bookings event (or a reconnect) wakes the loader."""
    first = True
    events = client.subscribe(KINDS)
    try:
        for event in events:
            if worker.is_cancelled:
                return
            kind = event.get("event")
            if kind == "fleet":
                if "error" in event:
                    app.post_message(TelemetryFailed(event["error"]))
                    continue
                if first:  # the first screen waits for no history: the cards now, the sparklines' ten minutes once
                    app.post_message(fleet_read(client, event))  # they are painted (reading them takes the CPU too)
                    app.first_paint.wait(FIRST_PAINT_WAIT_SECONDS)
                app.post_message(fleet_read(client, event, history_step if first else None))
                first = False
            elif kind == "bookings":
                if "error" in event:
                    app.post_message(DatabaseFailed(event["error"]))
                else:
                    bookings.wake()
            elif kind == "servers":
                app.post_message(ServersChanged(event.get("version", 0)))
            elif kind == "notice":
                app.post_message(Notice(str(event.get("message", ""))))
            elif kind == "down":
                app.post_message(DatabaseFailed(str(event.get("message", "the board service went away"))))
            elif kind == "reconnected":
                bookings.wake()
    except Exception as error:  # noqa: BLE001 - shown in the board
        app.post_message(DatabaseFailed(str(error)))
    finally:
        events.close()


def fleet_read(client, event: dict, history_step: float | None = None) -> TelemetryRead:
    """A `fleet` event from the service (this host's snapshot, and the other hosts'), as the board takes it; with
    `history_step` (the first read), the last ten minutes the service recorded at that step, so the sparklines
    start full."""
    history = None
    if history_step is not None:
        try:
            history = client.call("history", seconds=HISTORY_SECONDS, step=max(1, round(history_step)))
        except Exception:  # noqa: BLE001 - sparklines start empty instead
            pass
    return TelemetryRead(snapshot_from_wire(event["snapshot"]), history, event.get("host", ""),
                         hosts_from_wire(event.get("hosts", ())), event.get("stale_since"))


def bookings_loop(app, client, clock: Callable[[], float], window: Callable[[], tuple[int, int]], worker: "Poller") -> None:
    while not worker.is_cancelled:
        load_bookings(app, client, clock, *window(), cancelled=lambda: worker.is_cancelled)
        worker.wait(DB_RELOAD_SECONDS)


def load_bookings(app, client, clock: Callable[[], float], start: int, end: int,
                  cancelled: Callable[[], bool] = lambda: False) -> None:
    """One round of the bookings loader: post the live bookings and those in [start, end), then the alerts."""
    try:
        found = client.call("window", start=start, end=end)
    except Exception as error:  # noqa: BLE001 - e.g. the service is down: shown, retried on the next wake
        app.post_message(DatabaseFailed(str(error)))
        return
    if cancelled():
        return
    app.post_message(BookingsLoaded(BookingView(
        found["version"], tuple(booking_from_wire(b) for b in found["upcoming"]),
        tuple(booking_from_wire(b) for b in found["in_window"]), start, end, clock())))
    _load_alerts(app, client)


def servers_loop(app, client, worker: "Poller") -> None:
    from app.llama.health import TokenRate, metrics
    from app.llama.rows import READY, server_from_wire

    rates: dict[int, TokenRate] = {}
    keys: dict[int, str | None] = {}  # a server's /metrics wants its key: ours to read for our own servers only
    lines: tuple[ServerLine, ...] = ()
    mine = own_client(client)

    def key_of(server) -> str | None:
        if server.id not in keys:
            try:
                keys[server.id] = mine.call("serve_key", id=server.id)["key"]
            except BoardError:
                keys[server.id] = None
        return keys[server.id]

    try:
        while not worker.is_cancelled:
            try:
                now = time.time()
                found = [server_from_wire(s) for s in mine.call("serve_list", all=True, limit=200)]
                found = [s for s in found if s.live or (s.ended_at or s.created_at) >= now - RECENT_SECONDS]
                loaded = []
                for server in found:
                    rate = None
                    if server.state == READY and server.metrics:
                        tracker = rates.setdefault(server.id, TokenRate())
                        rate = tracker.update(metrics(server.host, server.port, timeout=0.5, key=key_of(server)),
                                              time.monotonic())
                    loaded.append(ServerLine(server, rate))
                lines = tuple(loaded)
                planned = tuple(p for p in mine.call("serve_plans") if p["next_start"] is not None)
                view = ServersView(lines, now, planned=planned)
            except Exception as error:  # noqa: BLE001 - e.g. the service is down: shown, retried on the next wake
                view = ServersView(lines, time.time(), f"{error}")
            app.post_message(ServersLoaded(view))
            metering = any(line.server.state == READY and line.server.metrics for line in view.lines)
            worker.wait(METRICS_SECONDS if metering else SERVERS_RELOAD_SECONDS)
    finally:
        if mine is not client:
            mine.close()


def own_client(client):
    """A client for one more thread: a socket of its own to the same service (one connection is one
    conversation), or the in-process client itself (its service gives each thread a connection)."""
    if client.transport == "socket":
        from app.client.socket import SocketClient

        return SocketClient(client.path)
    return client


def alerts_line(alerts: list[dict]) -> str:
    """The header's alerts: the newest one's message, and how many more."""
    if not alerts:
        return ""
    more = f" (+{len(alerts) - 1} more: board alerts)" if len(alerts) > 1 else ""
    return f"⚠ {alerts[0]['message']}{more}"


def _load_alerts(app, client) -> None:
    from app.tui.messages import AlertsLoaded

    try:
        found = client.call("alerts", limit=100)
    except Exception:  # noqa: BLE001 - an older service without alerts, or a hiccup: the header simply has none
        return
    app.post_message(AlertsLoaded(alerts_line(found)))

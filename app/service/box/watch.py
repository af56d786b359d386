"""The service's two watchers, each on a daemon thread: the fleet (one reader for every board) and the database.

The database watcher catches commits made by other processes on a file-mode database (a CLI
`board book` beside an open board); the service's own writes announce themselves at once. On PostgreSQL
other hosts' services write too, over either transport: the watcher LISTENs for the schema's NOTIFYs
(app.store.pg_schema) and wakes the boards at once.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from app.config import PostgresStore
from app.errors import BoardError
from app.gpu.model import hosts_to_wire, snapshot_to_wire
from app.store.db import connect, connect_pg, data_version

if TYPE_CHECKING:
    from app.service import Service
    from app.store.pg import PgConnection

DB_POLL_SECONDS = 1.0
LISTEN_RETRY_SECONDS = 1.0  # after the database went away: the connection backs off by itself beyond this
CLOCK_CHECK_SECONDS = 60.0  # how often the service compares its clock with the database's (board doctor reads it)


def start_watchers(service: Service) -> threading.Event:
    stop = threading.Event()
    loops = [("board-fleet", _fleet_loop)]
    if isinstance(service.config.store, PostgresStore):
        loops.append(("board-db-listen", _listen_loop))
    elif service.transport == "local":  # behind the socket the service is the only writer, and says so itself
        loops.append(("board-db-watch", _db_loop))
    for name, loop in loops:
        threading.Thread(target=loop, args=(service, stop), name=name, daemon=True).start()
    return stop


def _fleet_loop(service: Service, stop: threading.Event) -> None:
    while not stop.is_set():
        if service.hub.count:
            try:
                event = fleet_event(service)
            except Exception as error:  # noqa: BLE001 - a driver hiccup must not end the service
                service.hub.publish("fleet", {"error": f"{type(error).__name__}: {error}"})
            else:
                service.hub.publish("fleet", event)
        stop.wait(service.fleet.refresh_seconds)


def fleet_event(service: Service) -> dict:
    """The `fleet` event: this host's snapshot, its name, and the other hosts' as their services last published them
    (app.service.fleet.hosts), read at each refresh: a host that appears or falls silent reaches the boards with no
    booking change. While a PostgreSQL database is unreachable, `stale_since` says since when the boards' bookings are
    as last read (app.service.fleet.lastknown): their header shows it."""
    from app.service.fleet.hosts import remote_hosts  # start-up: only a service with boards publishes the fleet

    from app.service.fleet.lastknown import unreachable  # start-up: as above

    snapshot = service.fleet_snapshot()
    event = {"snapshot": snapshot_to_wire(snapshot), "host": service.host}
    try:
        remote = remote_hosts(service)
    except BoardError as error:  # the database away: this host's cards, and since when the bookings are as read
        if not unreachable(error):
            raise
        return {**event, "hosts": [], "stale_since": service.known.read_at or service.started_at}
    return {**event, "hosts": hosts_to_wire((r.host, r.snapshot, r.seen_at if r.down else None) for r in remote)}


def _db_loop(service: Service, stop: threading.Event) -> None:
    conn = None
    seen = None
    while not stop.is_set():
        try:
            conn = conn or connect(service.config.db_path)
            version = data_version(conn)
            if seen is not None and version != seen:  # another process wrote: bookings, servers, or both
                service.hub.changed("bookings")
                service.hub.changed("servers")
            seen = version
        except Exception as error:  # noqa: BLE001 - shown by the boards; the service keeps going
            service.hub.publish("bookings", {"error": str(error)})
        stop.wait(DB_POLL_SECONDS)


def _listen_loop(service: Service, stop: threading.Event) -> None:
    """LISTEN board_changes on a connection of its own; each NOTIFY's kind (bookings, servers) is changed at once.
    At start and every minute, the same connection measures this host's clock against the database's
    (Service.clock_offset): bookings are absolute times, so hosts must agree on now."""
    from app.store.pg import CHANNEL, clock_offset  # start-up: only a PostgreSQL store loads it

    store = service.config.store
    assert isinstance(store, PostgresStore)  # start_watchers starts this loop for one only
    conn: PgConnection | None = None
    checked = float("-inf")
    while not stop.is_set():
        try:
            if time.monotonic() - checked >= CLOCK_CHECK_SECONDS and conn is not None:
                service.clock_offset = clock_offset(conn)
                checked = time.monotonic()
                # A NOTIFY that came during that query may not reach notifies(): look again, once a minute.
                service.hub.changed("bookings")
                service.hub.changed("servers")
            if conn is None:
                conn = connect_pg(store)
                conn.execute(f"LISTEN {CHANNEL}")
                service.clock_offset = clock_offset(conn)
                checked = time.monotonic()
                # What others wrote while no one listened (at start, or while the database was away).
                service.hub.changed("bookings")
                service.hub.changed("servers")
            # Wakes at the first NOTIFY; at the latest after a second, to see `stop`.
            for note in conn.raw.notifies(timeout=DB_POLL_SECONDS):
                if note.payload in ("bookings", "servers"):
                    service.hub.changed(note.payload)
        except Exception as error:  # noqa: BLE001 - shown by the boards; the service keeps going and listens again
            from app.service.fleet.lastknown import unreachable  # start-up: loaded by the service already

            if not unreachable(error):  # an unreachable database is the fleet event's stale marker, not an error
                service.hub.publish("bookings", {"error": str(error)})
            if conn is not None:
                conn.close()
            conn = None
            stop.wait(LISTEN_RETRY_SECONDS)
    if conn is not None:
        conn.close()

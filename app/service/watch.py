"""The service's two watchers, each on a daemon thread: the fleet (one reader for every board) and the database.

The database watcher catches commits made by other processes on a file-mode database (a CLI
`board book` beside an open board); the service's own writes announce themselves at once.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from app.gpu.model import hosts_to_wire, snapshot_to_wire
from app.store.db import connect, data_version

if TYPE_CHECKING:
    from app.service import Service

DB_POLL_SECONDS = 1.0


def start_watchers(service: Service) -> threading.Event:
    stop = threading.Event()
    loops = [("board-fleet", _fleet_loop)]
    if service.transport == "local":  # behind the socket the service is the only writer, and says so itself
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
    (app.service.hosts), read at each refresh: a host that appears or falls silent reaches the boards with no
    booking change."""
    from app.service.hosts import remote_hosts  # start-up: only a service with boards publishes the fleet

    snapshot = service.fleet_snapshot()
    return {"snapshot": snapshot_to_wire(snapshot), "host": service.host, "hosts": hosts_to_wire(
        (r.host, r.snapshot, r.seen_at if r.down else None) for r in remote_hosts(service))}


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

"""Many hosts, one board: this host's heartbeat, and the other hosts' cards as their services last published them.

Each host's service writes its heartbeat and snapshot to the `hosts` table about once a second (`beat`); the
others read it from there. A host whose heartbeat is older than [fleet] heartbeat_timeout_s is down since its
last heartbeat: its cards show HOST DOWN, its bookings stay.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from app.config import PostgresStore
from app.core.text import inert
from app.errors import BadInput
from app.model import Booking
from app.gpu.model import FleetSnapshot, snapshot_from_wire, snapshot_to_wire
from app.service.fleet.lastknown import remember, unreachable
from app.store import bookings as rows
from app.store import events
from app.store import hosts as host_rows
from app.store.db import write

if TYPE_CHECKING:
    from app.service import Service

BEAT_S = 1.0  # how often a service writes its heartbeat (and snapshot)


@dataclass(frozen=True, slots=True)
class RemoteHost:
    """Another host, as its service last published it."""

    host: str
    seen_at: float
    snapshot: FleetSnapshot
    down: bool


def beat(service: Service) -> None:
    """Write this host's cards (claiming those recorded before the fleet) and its heartbeat with its snapshot."""
    snapshot = service.fleet_snapshot()
    now = service.clock()
    conn = service.conn
    host_rows.claim_cards(conn, service.host)
    with write(conn, own=True):  # this host's rows alone: a host holding the store's lock does not stop it
        rows.sync_cards(conn, snapshot.cards, int(now), service.host)
        host_rows.beat(conn, service.host, now, service.started_at, json.dumps(snapshot_to_wire(snapshot)))


def remote_hosts(service: Service) -> list[RemoteHost]:
    """The other hosts that have published, by name; a row that does not decode is left out."""
    now = service.clock()
    timeout = service.config.fleet.heartbeat_timeout_s
    found = []
    for row in host_rows.all_hosts(service.conn):
        if row.host == service.host:
            continue
        try:
            snapshot = snapshot_from_wire(json.loads(row.snapshot))
        except (ValueError, TypeError, KeyError):
            continue
        found.append(RemoteHost(row.host, row.seen_at, snapshot, down=now - row.seen_at > timeout))
    return found


def remote_host(service: Service, host: str) -> RemoteHost:
    """Another host by name; BadInput naming the known hosts when there is none."""
    for remote in remote_hosts(service):
        if remote.host == host:
            return remote
    known = ", ".join(sorted({service.host, *(r.host for r in remote_hosts(service))}))
    raise BadInput(f"there is no host '{inert(host, 63)}' on this board; the hosts are {known}")


def refuse_remote(service: Service, booking: Booking, verb: str = "run") -> None:
    """`board run`, `serve start` and `serve plan` act on the host where the cards are (a planned server starts
    through that host's runner): elsewhere, say where in one line."""
    if not here(service, booking):
        raise BadInput(f"those cards are on {booking.host}: {verb} this on {booking.host}")


def here(service: Service, booking: Booking) -> bool:
    """Whether the booking's cards are this host's (or recorded before the fleet, which makes them this host's)."""
    return not booking.host or booking.host == service.host


def start_heartbeat(service: Service, run_db: Callable[[Callable[[], Any]], Any],
                    stopping: threading.Event) -> threading.Thread:
    """The agent's heartbeat thread: about once a second, this host's beat (on the database thread, `run_db`, so
    that it never contends with the service's own writes) and, on SQLite, a look at the audit chain's tail, whose
    growth means another host's service changed bookings: this host's boards read them again. On PostgreSQL the
    change feed's NOTIFY has already woken them (app.service.box.watch): a second wake up to a second later would only
    make every open board load its window again (bench/bench_fleet.py). It also refreshes the bookings the service
    serves while the database is unreachable (app.service.fleet.lastknown)."""
    import logging  # start-up: only the agent beats; `board status` in file mode reads this module without logging

    log = logging.getLogger(__name__)
    follow_tail = not isinstance(service.config.store, PostgresStore)

    def beat_and_tail() -> int | None:
        beat(service)
        remember(service)
        return events.tail(service.conn) if follow_tail else None

    def loop() -> None:
        tail = None
        away = False  # the database is unreachable: said once when it goes, once when it is back
        while not stopping.is_set():
            try:
                latest = run_db(beat_and_tail)
            except Exception as error:  # noqa: BLE001 - a service must outlive one bad beat
                if stopping.is_set():  # (the database thread is gone once it stops)
                    pass
                elif not unreachable(error):
                    log.error(f"board agent: heartbeat failed: {type(error).__name__}: {error}")
                elif not away:
                    away = True
                    said = str(error).removesuffix("; nothing was changed")
                    log.warning(f"board agent: {said}; this host's reads answer from the bookings last read, its jobs"
                                " are enforced from them")
            else:
                if away:
                    away = False
                    log.info("board agent: the board database answers again")
                if tail is not None and latest != tail:
                    service.hub.changed("bookings")
                tail = latest
            stopping.wait(BEAT_S)

    thread = threading.Thread(target=loop, name="board-heartbeat", daemon=True)
    thread.start()
    return thread

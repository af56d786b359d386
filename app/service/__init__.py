"""The board service: every rule behind one door, for a caller whose identity the transport vouches for.

In process, the caller is the user who owns the database file; behind the socket
(app.service.door.server) it is whoever the kernel says is at the other end (SO_PEERCRED).
Each operation is one entry in `app.operations.OPERATIONS` (its home module, its flags), its request type and
handler registered from that module (app.service.ops.registry). Results are plain JSON values, the same over both
transports.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from app.config import Config
from app.core.identity import Identity, lookup_user
from app.errors import BadInput, BoardError
from app.gpu import NoDriverError, open_source
from app.gpu.fleet import Fleet
from app.operations import OPERATIONS
from app.service.door.hub import Hub
from app.service.fleet.lastknown import Known, unreachable
from app.service.ops.registry import lookup
from app.store import bookings as rows
from app.store.db import connect, is_postgres, storage_error

CALENDAR_PAST_S = 86400  # the calendar keeps bookings that ended up to a day before the service opened its file

if TYPE_CHECKING:
    from app.history.store import HistoryStore
    from app.service.box.processes import Registry
    from app.service.rules.bookings import BookingService
    from app.service.rules.plans import Runner
    from app.service.box.servers import Supervision
    from app.notify.deliver import Deliverer


class Service:
    def __init__(
        self,
        config: Config,
        fleet: Fleet,
        *,
        clock: Callable[[], float] = time.time,
        demo: bool = False,
        transport: str = "local",
    ):
        self.config, self.fleet, self.clock, self.demo, self.transport = config, fleet, clock, demo, transport
        self.host = config.fleet_host  # this host's name in the fleet: its cards and its heartbeat carry it
        self.started_at = clock()
        self.hub = Hub()
        self._local = threading.local()
        self._seeded = False
        self._servers_shown = False  # fleet_snapshot has shown llama-servers on the simulated cards
        if transport == "socket":
            _ = self.supervision  # made before the socket's threads run, not by the first of them
        self.runner: Runner | None = None  # the registered `board runner`, which starts planned servers
        self.wake_enforcer = threading.Event()  # set after a change that leaves work to stop (a forced move)
        self.notifier: Deliverer | None = None  # the delivery thread's, where the socket server runs one
        # On PostgreSQL: this host's clock minus the database's now(), in seconds, measured at start and every minute
        # (app.service.box.watch; app.store.pg.clock_offset); None until measured. board doctor fails beyond a second.
        self.clock_offset: float | None = None
        # The bookings as last read, for reads while a PostgreSQL database is unreachable (app.service.fleet.lastknown).
        self.known = Known()

    @functools.cached_property
    def processes(self) -> Registry:
        """Jobs and servers registered over the socket, by pidfd (app.service.box.processes), and the servers' reports
        on top of that (`supervision`). Made on first use: a read in process registers nothing."""
        from app.service.box.processes import Registry  # start-up: a read in process loads no pidfd registry

        return Registry()

    @functools.cached_property
    def supervision(self) -> Supervision:
        """The servers' supervisors (app.service.box.servers.Supervision), made on first use."""
        from app.service.box.servers import Supervision  # start-up: a booking command in process loads no servers

        return Supervision(self.processes)

    @functools.cached_property
    def history(self) -> HistoryStore:
        """The cards' history (board.history.db): the sampler writes it, the history and report operations and the
        alerts read it. Made on first use; its file opens when first read or written."""
        from app.history.store import HistoryStore  # start-up: booking commands in process do not load the history

        return HistoryStore(self.config.history_path)

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's connection; opened (and migrated, and seeded for a demo) on first use."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect(self.config.store)
            # The live bookings in memory (app.store.bookings.Calendar): a slot search asks at many starts. Not on
            # PostgreSQL: other hosts' services write there, and only SQL sees their commits.
            if not is_postgres(conn):
                rows.keep_calendar(conn, int(self.clock()) - CALENDAR_PAST_S)
            if self.demo and not self._seeded:
                from app.demo import seed_if_empty  # start-up: only a demo loads the demo's seed

                seed_if_empty(conn, self.fleet.latest().cards)
                self._seeded = True
            # The host whose service vouches for the actor, in each audit event; and whose cards those recorded
            # before the fleet are (the agent claims them: app.service.fleet.hosts.beat).
            conn.fleet_host = self.host
        return conn

    def call(self, me: Identity, op: str, args: Any) -> Any:
        """Run one operation for `me`; raises the BoardError a CLI would exit with."""
        entry = lookup(op)
        if entry is None:
            raise BadInput(f"unknown operation {str(op)[:40]!r}; this service speaks {', '.join(sorted(OPERATIONS))}")
        request = entry.check(args)
        self._local.told = []
        try:
            result = entry.run(self, me, request)
            if entry.frees:
                try:
                    self.backfill()  # queued bookings move up into the time this change freed
                except (sqlite3.Error, BoardError):
                    pass  # the change stands; the enforcer's next pass tries the backfill again
        except sqlite3.Error as error:
            raise storage_error(self.config.store, error) from None
        finally:
            if entry.changes_bookings:
                self.hub.changed("bookings")
            self.tell(self._local.told)
        return result

    def backfill(self) -> None:
        """Move queued bookings up where time has freed (BookingService.backfill); their holders are told."""
        if rows.queued(self.conn, int(self.clock())):
            from app.service.rules.audit import AGENT  # start-up: a read in process loads no booking rules

            rules = self.bookings(AGENT)
            if rules.backfill():
                self.hub.changed("bookings")
            self.tell(rules.told)

    def tell(self, told: list[tuple[int, str]]) -> None:
        """Publish the notices a change left for other users (BookingService.told), once it is committed."""
        for uid, message in told:
            self.hub.publish("notice", {"message": message}, uid=uid)
        told.clear()

    def bookings(self, me: Identity, host: str | None = None, booking: int | None = None) -> BookingService:
        """The booking rules for `me`, on this thread's connection and the newest view of the cards of `host` (this
        host's, or another's as its service last published them), or of the host where `booking` is."""
        if booking is not None and (found := rows.get(self.conn, booking)) is not None and found.host:
            host = found.host
        down_since = None
        if host is None or host == self.host:
            host, snapshot = self.host, self.fleet.latest()
        else:
            from app.service.fleet.hosts import remote_host  # start-up: only a booking on another host reads the fleet

            remote = remote_host(self, host)
            snapshot, down_since = remote.snapshot, remote.seen_at if remote.down else None
        from app.service.rules.bookings import BookingService  # start-up: a read in process loads no booking rules

        rules = BookingService(self.conn, me, self.config, snapshot.cards, snapshot.topology, self.clock,
                               jobs=self.processes.jobs_of, users=self.lookup_user, host=host)
        rules.down_since = down_since
        if self.transport == "socket":
            rules.word_refusals = False  # the client asks for a refusal's second half (op earliest) when it shows it
            rules.sole_writer = not is_postgres(self.conn)  # the agent alone writes its SQLite file
        told = getattr(self._local, "told", None)
        if told is None:
            told = self._local.told = []
        rules.told = told
        return rules

    def fleet_snapshot(self):
        """The newest FleetSnapshot for every board and `board status`; on a simulated fleet with the demo's
        llama-servers (they run on the CPU) shown on their booked cards, as NVML would show them."""
        # A command in process shows no servers: llama's modules load once one runs (or once one has been shown,
        # so that its end clears it).
        try:
            if self.fleet.simulated and (self._servers_shown or rows.any_live_server(self.conn)):
                from app.llama.processes import feed_simulated  # start-up: only the demo's fleet loads llama's modules

                if feed_simulated(self.fleet.source, self.conn):
                    self.fleet.invalidate()
                self._servers_shown = True
        except BoardError as error:  # the database away: the cards as read, without the servers' rows
            if not unreachable(error):
                raise
        return self.fleet.latest()

    def lookup_user(self, name: str) -> tuple[str, int] | None:
        """(name, uid) of a local account; in the demo also of its made-up people (alice, bob, ...), so that an
        admin can give them a booking there."""
        found = lookup_user(name)
        if found is None and self.demo:
            from app.demo import demo_person  # start-up: only a demo loads the demo's people

            found = demo_person(self.conn, self.fleet.latest().cards, name)
        return found

    def start_notifier(self, run_db: Callable[[Callable[[], Any]], Any], log: Callable[[str], None],
                       stopping: threading.Event) -> threading.Thread:
        """The delivery thread (behind the socket): pushes go out over HTTP on it, and its outbox work runs through
        `run_db` (on the database thread). Until it runs, notify_test delivers in the caller's thread."""
        from app.service.box.notify import deliverer  # start-up: a command in process sends no pushes

        self.notifier = deliverer(self, run_db, log)
        thread = threading.Thread(target=self.notifier.run, args=(stopping,), name="board-notify", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def open_service(config: Config, *, demo: bool | str | None = None, environ=None, transport: str = "local") -> Service:
    """The service on the configured database and the GPU source that `demo` picks (see app.gpu.open_source)."""
    try:
        source = open_source(demo, environ=environ if environ is not None else os.environ, host=config.fleet.host)
    except NoDriverError as error:
        raise BoardError(str(error)) from None
    except ValueError as error:  # a bad scenario file
        raise BadInput(str(error)) from None
    return Service(config, Fleet(source, config.refresh_seconds), demo=demo is not None, transport=transport)


__all__ = ["Service", "Fleet", "BoardError", "open_service"]

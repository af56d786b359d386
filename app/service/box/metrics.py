"""Prometheus's /metrics ([metrics] listen): the cards and the bookings as the service already knows them.

A scrape is cheap whoever asks and however often:
- the card gauges come from the fleet's shared snapshot (`Fleet.latest`): a scrape reads the GPUs only
  when nobody has for [display] refresh_seconds, and scrapers that come meanwhile share that read, so
  many scrapers cost no more GPU reads than one (at most one per refresh period);
- bookings and counters come from a view read on this module's own read-only connection, kept for
  VIEW_TTL_S and read again sooner only when the bookings changed (the hub's version); one scraper
  reads it while the others wait for it, so a crowd of scrapers costs one read;
- the counters are totals of the audit log (append-only), read with a cursor: each read adds only the
  events after the last one seen. A restarted service reads the log once and carries on from the same
  totals, so Prometheus sees no counter reset.
Nothing here writes to the database.

Anyone who can reach the port may connect, so the server is bounded: at most MAX_SCRAPES connections
are served at once, each on a thread of a fixed pool and with REQUEST_TIMEOUT_S for its whole request
(and as long again for the answer); more are closed at once, unread. However many connect, /metrics
holds no more files than that, and the socket's caps leave room for them (app.service.door.server.FD_RESERVE).

Counters for sources that do not exist yet (Xid, OOM, alerts, notify failures) are not exported as
zeros: each comes with its section as a line in COUNTED (an audit action) or its own family in
`BoardCollector.collect`.
"""

from __future__ import annotations

import io
import socket
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator
from urllib.parse import quote
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from app.core.cardstate import BOOKED, FREE, IN_USE, LOST, SQUATTED, fleet_status
from app.errors import BoardError
from app.gpu.model import running_link_mib_s
from app.history.store import energy_totals
from app.model import Booking
from app.service.conn.deadline import DeadlineStream
from app.store import bookings as rows
from app.config import PostgresStore
from app.store.db import BoardConnection, connect, is_postgres, storage_error

if TYPE_CHECKING:
    from app.service import Service

VIEW_TTL_S = 5.0  # the queue and the counters move without a bookings change (a crash, time): read again this often
AHEAD_S = 3600  # the view holds the bookings of the next hour, so the holder at each scrape's own time is right
REQUEST_TIMEOUT_S = 10.0  # a scraper sends its whole request within this, or it is closed
MAX_SCRAPES = 16  # connections served at once, each a thread and a file; more are closed at once
MIB = 1024 * 1024
STATES = {FREE: "free", BOOKED: "booked", IN_USE: "in_use", SQUATTED: "squatted", LOST: "lost"}
ENERGY_HELP = ("Energy the cards drew while bookings held them, by project ('' without [[projects]]) and holder:"
               " NVML's energy counter where the card has one, else the power samples.")
CARD_LABELS = ("uuid", "index", "name", "pool", "holder", "class", "booking_id")

# The counters that the audit log carries: (metric, help, which events, the label's name, the details key it is read
# from).
# An event's refusal category ("refused_by") is written since metrics came; older refusals count as "unknown".
COUNTED = (
    ("board_bookings_created", "Bookings created (each occurrence of a series counts), by class.",
     "action = 'create' AND ok = 1", "class", "class"),
    # A series' extension asks for bookings as the series did: its refusals count alike.
    ("board_bookings_refused", "Booking requests refused, by reason: conflict (the time is taken) or policy (a rule).",
     "action IN ('create', 'series', 'series_extend') AND ok = 0", "reason", "refused_by"),
    ("board_backfill_moves", "Queued bookings moved earlier by the backfill.", "action = 'backfill' AND ok = 1", None, None),
    ("board_server_crashes", "llama-servers that exited without being stopped.", "action = 'server-crash'", None, None),
    ("board_idle_releases", "Bookings given back for being idle ([policy] idle_release_after_min).",
     "action = 'idle_release' AND ok = 1", None, None),
)


@dataclass
class View:
    """What the database says, as of `read_at` (monotonic): the live bookings, the queue and the counters."""

    live: list[Booking] = field(default_factory=list)
    queued: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # metric -> label value ("" when none) -> total
    cursor: int = 0  # the last event id counted
    version: int | None = None  # the hub's bookings version it was read at
    read_at: float = float("-inf")
    alerts: dict[str, int] = field(default_factory=dict)  # rule -> alerts fired (rows are kept: a counter)
    faults: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, Xid code or "") -> faults (rows are kept)
    energy: dict[tuple[str, str], float] | None = None  # (project, user) -> J on their bookings' cards; None: no history
    waits: tuple[int, float] = (0, 0.0)  # the bookings that have started: how many, and their waits summed (s)


class BoardCollector(Collector):
    def __init__(self, service: Service, *, ttl_s: float = VIEW_TTL_S, clock: Callable[[], float] = time.monotonic):
        self.service, self.ttl_s, self.clock = service, ttl_s, clock
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._view = View()
        self.reads = 0  # database reads so far: the tests check that scrapes share them

    def describe(self) -> list[Metric]:
        return []  # no collect() at registration: the service may not have read the fleet yet

    def collect(self) -> Iterator[Metric]:
        snapshot = self.service.fleet.latest()
        view = self.view()
        pools: dict[int, list[str]] = {}  # a card in two pools has both names, "prod,night"
        for pool in self.service.config.pools:
            for index in pool.cards:
                pools.setdefault(index, []).append(pool.name)
        statuses = fleet_status(snapshot, view.live, self.service.clock(), hot_celsius=self.service.config.hot_celsius)

        def gauge(name: str, text: str, unit_labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=[*CARD_LABELS, *unit_labels])

        families = {
            "memory_used": gauge("board_gpu_memory_used_bytes", "VRAM in use."),
            "memory_total": gauge("board_gpu_memory_total_bytes", "VRAM on the card."),
            "utilization": gauge("board_gpu_utilization_ratio", "GPU utilisation, 0 to 1, over NVML's last sample period."),
            "temperature": gauge("board_gpu_temperature_celsius", "GPU temperature."),
            "power": gauge("board_gpu_power_watts", "Power draw."),
            "power_limit": gauge("board_gpu_power_limit_watts", "Power limit."),
            "sm_clock": gauge("board_gpu_sm_clock_hertz", "SM clock."),
            "power_policy": gauge("board_gpu_power_policy_watts", "The power limit [power] sets for the card (only where"
                                  " it sets one): a limit that differs has drifted (board power apply)."),
            "pcie_link": gauge("board_gpu_pcie_link_utilization_ratio", "PCIe traffic, the busier of TX and RX, as a"
                               " share of the link's capacity (0 to 1): a TP group's link share (docs/health.md)."),
            "state": gauge("board_gpu_state", "The card's state: 1 for the state it is in, 0 for the others.", ("state",)),
        }
        for status in statuses:
            reading, booking = status.reading, status.booking
            labels = [reading.uuid, str(reading.index), reading.name or "", ",".join(pools.get(reading.index, ())),
                      booking.user if booking else "", booking.klass if booking else "", str(booking.id) if booking else ""]
            sm_clock = getattr(reading, "sm_clock_mhz", None)  # the history's field (issue 12, section 1), when there
            for key, value in (
                ("memory_used", _scaled(reading.memory_used_mib, MIB)),
                ("memory_total", _scaled(reading.memory_total_mib, MIB)),
                ("utilization", _scaled(reading.utilization_pct, 0.01)),
                ("temperature", reading.temperature_c),
                ("power", reading.power_w),
                ("power_limit", reading.power_limit_w),
                ("sm_clock", _scaled(sm_clock, 1e6)),
                ("power_policy", self.service.config.power.policy_w(reading.index)),
                ("pcie_link", _link_share(reading)),
            ):
                if value is not None and not reading.lost:  # no value is better than a made-up one
                    families[key].add_metric(labels, value)
            for state, name in STATES.items():
                families["state"].add_metric([*labels, name], 1.0 if status.state == state else 0.0)
        yield from (family for family in families.values() if family.samples)
        yield GaugeMetricFamily("board_fleet_read_timestamp_seconds", "When the GPUs were last read (Unix time).",
                                value=snapshot.taken_at)
        yield GaugeMetricFamily("board_bookings_queued", "Bookings waiting in the queue to move earlier.", value=view.queued)
        started, waited = view.waits
        yield SummaryMetricFamily("board_booking_wait_seconds", "How long the bookings that have started waited: their"
                                  " start less the start their holders asked for (0 for a booking that got it).",
                                  count_value=started, sum_value=waited)
        for name, text, _, label, _ in COUNTED:
            counter = CounterMetricFamily(name, text, labels=[label] if label else None)
            totals = view.counts.get(name, {})
            if label:
                for label_value, total in sorted(totals.items()):
                    counter.add_metric([label_value], total)
            else:
                counter.add_metric([], totals.get("", 0))
            yield counter
        alerts = CounterMetricFamily("board_alerts", "Alerts fired (app.alerts), by rule.", labels=["rule"])
        for rule, total in sorted(view.alerts.items()):
            alerts.add_metric([rule], total)
        yield alerts
        xid = CounterMetricFamily("board_xid_errors", "Critical Xid errors NVML reported (app.faults), by code.",
                                  labels=["code"])
        for (kind, code), total in sorted(view.faults.items()):
            if kind == "xid":
                xid.add_metric([code], total)
        yield xid
        yield CounterMetricFamily("board_oom", "Out-of-memory exits: llama-servers and board run jobs (app.faults).",
                                  value=sum(n for (kind, _), n in view.faults.items() if kind == "oom"))
        if view.energy is not None:  # with [history] on: the sampler counts it (app.history.store's energy_totals)
            energy = CounterMetricFamily("board_energy_joules", ENERGY_HELP, labels=["project", "user"])
            for (project, user), joules in sorted(view.energy.items()):
                energy.add_metric([project, user], joules)
            yield energy
        notifier = self.service.notifier
        if notifier is not None:  # only where the socket service delivers; in memory: a restart resets it
            failures = CounterMetricFamily("board_notify_failures", "Pushes that failed: each failed try, and the"
                                           " messages given up after the last try.", labels=["outcome"])
            failures.add_metric(["failed_try"], notifier.counts["failed_tries"])
            failures.add_metric(["given_up"], notifier.counts["given_up"])
            yield failures

    def view(self) -> View:
        """The database's view, read again when older than ttl_s or when the bookings changed; shared by scrapers."""
        with self._lock:
            view = self._view
            version = self.service.hub.versions.get("bookings")
            if view.version == version and self.clock() - view.read_at < self.ttl_s:
                return view
            self._view = self._read(view, version)
            return self._view

    def _read(self, before: View, version: int | None) -> View:
        conn = self._connection()
        now = int(self.service.clock())
        counts = {name: dict(totals) for name, totals in before.counts.items()}
        postgres = is_postgres(conn)
        # One snapshot of the database for the bookings and the events.
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if postgres else "BEGIN")
        try:
            # The next hour's too: a booking that starts between two reads takes its card at the scrape that follows.
            live = rows.live_between(conn, now, now + AHEAD_S)
            queued = len(rows.queued(conn, now))
            cursor = conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
            for name, _, where, _, key in COUNTED:
                value = (f"board_json_field(details, '{key}')" if postgres else
                         f"CASE WHEN json_valid(details) THEN json_extract(details, '$.{key}') END") if key else "''"
                found = conn.execute(f"SELECT {value}, count(*) FROM events WHERE id > ? AND id <= ? AND {where} GROUP BY 1",
                                     (before.cursor, cursor))
                totals = counts.setdefault(name, {})
                for label, n in found:
                    label = "unknown" if label is None else str(label)
                    totals[label] = totals.get(label, 0) + n
            alerts = dict(conn.execute("SELECT rule, count(*) FROM alerts GROUP BY rule").fetchall())
            # As the alert rule `wait` reads them (app.alerts.engine): a cancelled booking no longer counts.
            started, waited = conn.execute(
                "SELECT count(*), coalesce(sum(CASE WHEN starts_at > requested_at THEN starts_at - requested_at ELSE 0"
                " END), 0) FROM bookings WHERE status = 'booked' AND requested_at > 0 AND starts_at <= ?", (now,)).fetchone()
            faults = {(kind, "" if code is None else str(code)): n for kind, code, n in conn.execute(
                "SELECT kind, code, count(*) FROM faults WHERE kind IN ('xid', 'oom') GROUP BY 1, 2")}
        finally:
            conn.execute("COMMIT")
        config = self.service.config
        energy = energy_totals(config.history_path) if config.history.enabled else None
        self.reads += 1
        return View(live, queued, counts, cursor, version, self.clock(), alerts, faults, energy, (started, float(waited)))

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None and isinstance(self.service.config.store, PostgresStore):
            conn = connect(self.service.config.store)  # its own connection, read-only: a scrape can never write
            conn.execute("SET default_transaction_read_only = on")
            self._conn = conn
        if self._conn is None:
            path = self.service.config.db_path
            try:
                # Read-only: a scrape can never write, whatever a bug here does. Used under self._lock only.
                conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, isolation_level=None,
                                       check_same_thread=False, factory=BoardConnection, timeout=10)
                conn.path = path
                conn.text_factory = lambda data: data.decode("utf-8", "replace")
            except sqlite3.Error as error:
                raise storage_error(path, error) from None
            self._conn = conn
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _link_share(reading) -> float | None:
    """The busier direction of the card's PCIe traffic over its link's capacity, as the report's TP groups measure it."""
    traffic = [v for v in (reading.pcie_tx_mib_s, reading.pcie_rx_mib_s) if v is not None]
    capacity = running_link_mib_s(reading)
    return max(traffic) / capacity if traffic and capacity else None


class _Handler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # sending the answer (sendall's timeout is for all of it)

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the request line and headers are read with one deadline for all of them
        self.rfile = io.BufferedReader(DeadlineStream(self.connection, time.monotonic() + REQUEST_TIMEOUT_S))

    def log_message(self, format, *args) -> None:
        pass  # a line per scrape would fill the service's log


class _Server(WSGIServer):
    request_queue_size = 128  # socketserver's 5 drops the SYNs of a crowd of scrapers: a 1 s retransmit each

    def __init__(self, *args, **kwargs) -> None:
        self.pool = ThreadPoolExecutor(MAX_SCRAPES, thread_name_prefix="board-metrics")  # threads start as needed
        self.slots = threading.BoundedSemaphore(MAX_SCRAPES)
        super().__init__(*args, **kwargs)  # binds: a port in use closes the server (and the pool) at once

    def process_request(self, request, client_address) -> None:
        """On the accepting thread: to a worker when one is free, else closed at once, unread."""
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        self.pool.submit(self._serve, request, client_address)

    def _serve(self, request, client_address) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:
            pass  # the scraper went away, or ran out of time
        except Exception:  # noqa: BLE001 - one bad request must not take a worker with it
            self.handle_error(request, client_address)
        finally:
            self.slots.release()  # before the close: a scraper that saw its answer end finds its slot free
            self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        self.pool.shutdown(wait=False)


class MetricsServer:
    """/metrics on [metrics] listen: an accepting thread and a pool of MAX_SCRAPES workers; `close` stops it."""

    def __init__(self, service: Service, log: Callable[[str], None]):
        self.collector = BoardCollector(service)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)  # the service's own CPU and memory
        self.log = log
        self._failed: str | None = None
        host, port = service.config.metrics.address
        server_class = type("_Server", (_Server,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
        try:
            self.httpd: _Server = make_server(host, port, self._app(make_wsgi_app(self.registry)), server_class,
                                              handler_class=_Handler)
        except OSError as error:
            raise BoardError(f"can't serve /metrics on {service.config.metrics.listen} ({error.strerror or error});"
                             " free the port or change [metrics] listen") from None
        self.port: int = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="board-metrics", daemon=True)
        self.thread.start()

    def _app(self, app):
        """The library's app, but a database that cannot be read is one line in the log and a 503, not a traceback."""

        def guarded(environ, start_response):
            try:
                return app(environ, start_response)
            except (BoardError, sqlite3.Error) as error:
                message = f"/metrics: {error}"
                if message != self._failed:  # once per distinct failure, not once per scrape
                    self._failed = message
                    self.log(message)
                start_response("503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
                return [f"{message}\n".encode()]

        return guarded

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
        self.collector.close()


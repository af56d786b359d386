"""The service's sampler: every `[history] sample_s` it records each card, and once a minute it rolls up, prunes and
sums the finished days for the report.

It is its own daemon thread with its own connections (to board.history.db for writing, to board.db for
reading the bookings), not jobs on the service's database thread: the booking operations run on that one
thread in arrival order, so a sample queued there would wait behind a slow operation and delay the next
one in turn. Here nothing is shared: the history file has no other writer, each transaction is one round
of samples, an hour of rollups or an hour of pruning, and the bookings are read from a WAL snapshot, which
neither waits for nor blocks the booking writes.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Callable

from app.config import Config
from app.core.cardstate import UNKNOWN_USER, fleet_status
from app.gpu.fleet import Fleet
from app.gpu.model import FleetSnapshot
from app.errors import BoardError
from app.history.fleet import Pusher
from app.history.store import HistoryStore, Sample
from app.model import Booking
from app.store import bookings as rows
from app.store.db import connect

MAINTAIN_EVERY_S = 60.0
FOREVER = 2**62


def sample_fleet(live: list[Booking], config: Config, snapshot: FleetSnapshot, now: float) -> list[Sample]:
    """One round: every card of the snapshot, with its state from the bookings `live` at `now`."""
    statuses = fleet_status(snapshot, live, now, hot_celsius=config.hot_celsius, labels=config.labels)
    dt = max(1, round(config.history.sample_s))
    found = []
    for status in statuses:
        r = status.reading
        users: dict[str, int | None] = {}
        for p in r.processes:
            user = p.user or UNKNOWN_USER
            before = users.get(user)
            users[user] = p.used_mib if before is None else before + (p.used_mib or 0)
        found.append(Sample(
            ts=int(snapshot.taken_at), uuid=r.uuid, state=status.state, dt=dt, vram=r.memory_used_mib,
            util=r.utilization_pct, temp=r.temperature_c, power=_whole(r.power_w), power_limit=_whole(r.power_limit_w),
            sm=r.sm_clock_mhz, throttle=r.throttle_reasons, pcie=_pcie(r),
            booking=status.booking.id if status.booking else None,
            holder=status.booking.user if status.booking else None, users=tuple(users.items()),
            energy_mj=r.energy_mj, project=status.booking.project if status.booking else None))
    return found


def _pcie(reading) -> int | None:
    """The busier direction of the card's PCIe link, MiB/s: what its share of the link is measured by."""
    found = [v for v in (reading.pcie_tx_mib_s, reading.pcie_rx_mib_s) if v is not None]
    return _whole(max(found)) if found else None


class Sampler:
    """`run(stop)` is the loop; `sample_once` and `maintain` are one step each, for tests with their own clock."""

    def __init__(self, fleet: Fleet, store: HistoryStore, config: Config, clock: Callable[[], float], *,
                 log: Callable[[str], None] = print, rolled: Callable[[], None] = lambda: None) -> None:
        self.fleet, self.store, self.config, self.clock, self.log = fleet, store, config, clock, log
        self.settings = config.history
        self.rolled = rolled  # called after each roll-up (and at the end): wakes the pusher (app.history.fleet)
        self._maintained_at = float("-inf")
        self._conn: sqlite3.Connection | None = None
        self._live: list[Booking] = []  # the bookings last read, for a PostgreSQL store that is unreachable

    @property
    def conn(self) -> sqlite3.Connection:
        """The sampler's own connection to board.db, for the bookings: opened by the thread that samples."""
        if self._conn is None:
            self._conn = connect(self.config.store)
        return self._conn

    def sample_once(self) -> list[Sample]:
        snapshot = self.fleet.latest()
        now = self.clock()
        try:
            self._live = rows.live_between(self.conn, int(now), FOREVER)
        except (BoardError, sqlite3.Error):
            # A PostgreSQL store that is unreachable: the cards are still sampled, their states from the bookings
            # last read (as enforcement goes on from them). A SQLite file that fails is the sample's failure.
            if not self.config.storage_url:
                raise
        samples = sample_fleet(self._live, self.config, snapshot, now)
        for card in snapshot.cards:
            self.store.card_id(card.uuid, card.index, card.name, card.memory_total_mib)
        self.store.add(samples)
        return samples

    def maintain(self, now: float | None = None) -> tuple[int, int, int]:
        """Roll up the finished buckets, prune, and sum the finished days for the report (an older file's a week
        at a time): (buckets rolled, samples deleted, rollups deleted)."""
        now = self.clock() if now is None else now
        rolled = self.store.roll_up(now)
        self.rolled()
        samples, rollups = self.store.prune(now, raw_hours=self.settings.raw_hours,
                                            rollup_days=self.settings.rollup_days)
        self.store.summarise(self.config.report.busy_util)
        return rolled, samples, rollups

    def step(self) -> None:
        """One turn of the loop: a sample, and the upkeep when a minute has passed."""
        self.sample_once()
        now = self.clock()
        if now - self._maintained_at >= MAINTAIN_EVERY_S:
            self._maintained_at = now
            self.maintain(now)

    def run(self, stop: threading.Event) -> None:
        failing = None  # the last failure logged: a full disk says so once, not every 10 s
        try:
            while not stop.is_set():
                try:
                    self.step()
                except Exception as error:  # noqa: BLE001 - a service outlives one bad sample (a full disk, say)
                    line = f"history: sample failed: {type(error).__name__}: {error}"
                    if line != failing:
                        self.log(line)
                    failing = line
                else:
                    if failing is not None:
                        self.log("history: sampling again")
                    failing = None
                stop.wait(self.settings.sample_s)
        finally:
            self.rolled()  # a pusher waiting for the next roll-up sees `stop` at once
            self.store.close()
            if self._conn is not None:
                self._conn.close()


def start_sampler(fleet: Fleet, store: HistoryStore, config: Config, clock: Callable[[], float], *,
                  log: Callable[[str], None] = print) -> threading.Event | None:
    """Start the sampler thread if [history] is enabled, and with a PostgreSQL store the thread that copies the
    rollups there (app.history.fleet); set the returned event to stop them."""
    if not config.history.enabled:
        return None
    stop = threading.Event()
    rolled: Callable[[], None] = lambda: None  # noqa: E731
    if config.storage_url:
        pusher = pusher_of(store, config, clock, log=log)
        rolled = pusher.wake.set
        threading.Thread(target=pusher.run, args=(stop,), name="board-rollups", daemon=True).start()
    sampler = Sampler(fleet, store, config, clock, log=log, rolled=rolled)
    threading.Thread(target=sampler.run, args=(stop,), name="board-history", daemon=True).start()
    return stop


def pusher_of(store: HistoryStore, config: Config, clock: Callable[[], float], *,
              log: Callable[[str], None] = print) -> Pusher:
    """This host's pusher of rollups to the PostgreSQL store, on its own connection."""
    return Pusher(store, lambda: connect(config.store), config.fleet_host, rollup_days=config.history.rollup_days,
                  clock=clock, log=log)


def _whole(watts: float | None) -> int | None:
    return None if watts is None else round(watts)

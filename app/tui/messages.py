"""Messages the board's worker threads post to the app. Each carries a frozen snapshot, never a live object."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from app.gpu.model import FleetSnapshot, HostSnapshot
from app.llama.rows import Server
from app.model import Booking


class TelemetryRead(Message):
    """One poll of the GPU source. Frequent, so a newer one replaces an unhandled older one."""

    def __init__(self, snapshot: FleetSnapshot, history: dict[str, list] | None = None, host: str = "",
                 hosts: tuple[HostSnapshot, ...] = (), stale_since: float | None = None) -> None:
        super().__init__()
        self.snapshot = snapshot
        # The database unreachable: the service's bookings are as it read them then (app.service.fleet.lastknown)
        self.stale_since = stale_since
        self.host = host  # this host's name in the fleet ('' from a service that names none)
        self.hosts = hosts  # the other hosts' cards, as their services last published them
        # Earlier samples to fill the sparklines with, per card uuid (the first read; ops.reads.history).
        self.history = history or {}

    def can_replace(self, message: Message) -> bool:
        # Textual drops this one for the newer `message` when True: never drop the one carrying history.
        return isinstance(message, TelemetryRead) and not self.history


class TelemetryFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


@dataclass(frozen=True, slots=True)
class BookingView:
    """The live bookings as one reader saw them at one data_version."""

    version: int
    upcoming: tuple[Booking, ...]  # live bookings that end after `loaded_at`: card states, my bookings, toasts
    window: tuple[Booking, ...]  # live bookings overlapping [window_start, window_end): the timeline
    window_start: int
    window_end: int
    loaded_at: float


class BookingsLoaded(Message):
    """The database changed (another process, or this one), or the timeline asked for another window."""

    def __init__(self, view: BookingView) -> None:
        super().__init__()
        self.view = view

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, BookingsLoaded)


class DatabaseFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class ServersChanged(Message):
    """The service's servers changed: the servers loader loads them again."""

    def __init__(self, version: int) -> None:
        super().__init__()
        self.version = version


class Notice(Message):
    """A message from the service to this user (a booking moved, a job will be stopped)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class AlertsLoaded(Message):
    """The alerts firing now, as one line for the header ("" when none)."""

    def __init__(self, line: str) -> None:
        super().__init__()
        self.line = line

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, AlertsLoaded)


@dataclass(frozen=True, slots=True)
class ServerLine:
    server: Server
    tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class ServersView:
    """The servers as one serve_list saw them (the live ones and those that ended in the last day), with the
    tokens/s of ready ones; `error` when the last load failed (the lines are then the last ones loaded)."""

    lines: tuple[ServerLine, ...]
    loaded_at: float
    error: str | None = None
    planned: tuple[dict, ...] = ()  # serve_plans' plans with an occurrence ahead (app.service.rules.plans.plan_wire)


class ServersLoaded(Message):
    """A new ServersView; a newer one replaces an unhandled older one."""

    def __init__(self, view: ServersView) -> None:
        super().__init__()
        self.view = view

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ServersLoaded)

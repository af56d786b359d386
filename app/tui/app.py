"""The board TUI: `board` with no subcommand.

`BoardApp(...)` takes its parts injected (the client, identity, config, clock, host name), so
tests and screenshots run on a frozen clock and a simulated fleet. `run_board` is what app.cli
calls.

The board talks to the service only through its client (app.client): in process on a file the
user owns, or over the shared service's socket; it cannot tell which. Threads: the events
loop follows the service's subscription, and the bookings and servers loaders reload on each
change (all in app.tui.pollers, started by `start_pollers`, posting frozen snapshots); the
screens' calls run on one more thread (app.tui.backend). The UI thread never waits on the
service.

Screens that show the fleet, the bookings or the servers hear of each new snapshot through
`.fleet_signal`, `.bookings_signal` and `.servers_signal` (Textual Signals).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Iterable

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import ModalScreen, Screen
from textual.signal import Signal

from app.config import Config
from app.core.cardstate import CardStatus, fleet_status
from app.core.identity import Identity
from app.core.text import cards_text, inert
from app.gpu.model import FleetSnapshot, HostSnapshot, sample
from app.tui.backend import Backend
from app.tui.hangup import ending_on_hangup
from app.tui.messages import (
    AlertsLoaded,
    BookingsLoaded,
    BookingView,
    DatabaseFailed,
    Notice,
    ServersChanged,
    ServersLoaded,
    ServersView,
    TelemetryFailed,
    TelemetryRead,
)
from app.tui.pollers import HISTORY_SECONDS, Poller, bookings_loop, events_loop, servers_loop
from app.tui.render import short_time
from app.tui.screens.main import BoardScreen
from app.tui.widgets.header import BoardHeader
from app.tui.timeline_model import default_window

if TYPE_CHECKING:  # the form loads when first opened, not at the board's start
    from app.tui.screens.booking_form import BookingDraft

ENDING_SOON_SECONDS = 600
STALL_ALERT_SECONDS = 5.0


class BoardApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "board"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS = [
        Binding("q", "quit_board", "Quit", tooltip="Leave the board (bookings and servers keep running)"),
        Binding("b", "book", "Book", tooltip="Book cards: the timeline selection or the highlighted card"),
        Binding("m", "my_bookings", "Mine", tooltip="My bookings: cancel, release, extend"),
        Binding("question_mark", "help", "Help", tooltip="Every key"),
    ]

    def __init__(
        self,
        client,
        *,
        identity: Identity,
        config: Config,
        clock: Callable[[], float] = time.time,
        host: str | None = None,
        history_step: float | None = None,
    ) -> None:
        super().__init__()
        self.client, self.identity, self.config, self.clock = client, identity, config, clock
        self.host = socket.gethostname() if host is None else host
        self.refresh_seconds = max(0.2, float(config.refresh_seconds))
        self.history_step = history_step or max(self.refresh_seconds, 1.0)
        self.fleet: FleetSnapshot | None = None
        self.fleet_host = config.fleet_host  # this host's name in the fleet, as its service says (TelemetryRead)
        self.hosts: tuple[HostSnapshot, ...] = ()  # the other hosts' cards: shown after this host's
        self.view: BookingView | None = None
        self.servers_view: ServersView | None = None
        self.statuses: tuple[CardStatus, ...] = ()
        self.history: dict[str, deque[tuple[float, ...]]] = {}  # [t, VRAM GiB, util, temp, power W]
        self.alert = ""  # the board's own trouble: telemetry stalled or failed, the service down
        self._alert_from = ""  # which: "telemetry" or "service", cleared when that recovers
        self.alerts_line = ""  # the service's firing alerts (app.alerts), in one line
        self.stale_since: float | None = None  # the database unreachable since: the bookings shown are as of then
        self.warned: set[tuple[int, int]] = set()  # (booking id, end) already toasted
        self.last_telemetry = time.monotonic()
        # Set once the first fleet snapshot is on the screen: the events loop reads its history only then, so the
        # history's read does not take the CPU that the first paint needs (app.tui.pollers.events_loop).
        self.first_paint = threading.Event()
        self._last_tick = 0.0
        self.window = default_window(clock())  # the span the timeline shows: the loader loads its bookings
        self.fleet_signal: Signal[FleetSnapshot] = Signal(self, "fleet")
        self.bookings_signal: Signal[BookingView] = Signal(self, "bookings")
        self.servers_signal: Signal[ServersView] = Signal(self, "servers")
        self._bookings = Poller("board-bookings", lambda p: bookings_loop(
            self, client, clock, lambda: self.window, p))
        self._events = Poller("board-events", lambda p: events_loop(self, client, self._bookings, p, self.history_step))
        self._servers = Poller("board-servers", lambda p: servers_loop(self, client, p))
        self.backend = Backend(client, clock, self.reload_bookings, config)
        # Keys that exist only for some: non-admins never get the admin key, nor its palette entry.
        if identity.is_admin:
            self.bind("a", "admin", description="Admin")
        self.bind("s", "servers", description="Servers")  # after the admin key, where the footer has it

    # -- life cycle ----------------------------------------------------------------------------

    def get_default_screen(self) -> Screen:
        self._board = BoardScreen()
        return self._board

    def on_mount(self) -> None:
        self.start_pollers()
        self.set_interval(1.0, self._tick_if_idle)

    def start_pollers(self) -> None:
        """The threads that bring the service's state (app.tui.pollers); tests that check what the board shows
        leave them off and post their messages themselves."""
        self._events.start()
        self._bookings.start()
        self._servers.start()

    def on_unmount(self) -> None:
        self.first_paint.set()  # the events loop waits for it no longer
        self._events.stop()
        self._bookings.stop()
        self._servers.stop()
        self.backend.close()
        self.client.close()

    @property
    def board(self) -> BoardScreen:
        # Not screen_stack[0]: on exit the stack empties while the pollers' last messages are still being
        # handled, and the screen itself (BoardScreen.torn_down) knows to ignore them.
        return self._board

    def set_window(self, start: int, end: int) -> None:
        """The timeline shows another span: have the poller load its bookings now."""
        self.window = (start, end)
        self.reload_bookings()

    def reload_bookings(self) -> None:
        """Have the bookings loader load now (the window moved, or this board wrote); from any thread."""
        self._bookings.wake()

    def reload_servers(self) -> None:
        """Have the servers loader load now (a start or a stop from this board); from any thread."""
        self._servers.wake()

    # -- data from the pollers -----------------------------------------------------------------

    @on(TelemetryRead)
    def _telemetry_read(self, message: TelemetryRead) -> None:
        self.last_telemetry = time.monotonic()
        for uuid, samples in message.history.items():
            shown = self.history.pop(uuid, ())  # the first snapshot comes before its history (app.tui.pollers)
            for taken_at, *values in (*samples, *shown):
                self._remember(uuid, taken_at, values)
        for card in message.snapshot.cards:
            self._remember(card.uuid, message.snapshot.taken_at, sample(message.snapshot.taken_at, card)[1:])
        self.fleet, self.hosts, self.stale_since = message.snapshot, message.hosts, message.stale_since
        self.fleet_host = message.host or self.fleet_host
        self._clear_alert("telemetry")
        self._recompute()
        self._sync_headers()
        self.board.show_fleet()
        self.fleet_signal.publish(message.snapshot)
        self._tick()  # the clock moves in the same repaint as the figures
        if not self.first_paint.is_set():
            self.call_after_refresh(self.first_paint.set)

    def _remember(self, uuid: str, taken_at: float, values) -> None:
        keep = int(HISTORY_SECONDS / self.history_step) + 1
        samples = self.history.get(uuid)
        if samples is None:
            samples = self.history[uuid] = deque(maxlen=keep)
        if samples and (samples[-1][0] >= taken_at or taken_at - samples[-1][0] < self.history_step * 0.5):
            return
        samples.append((taken_at, *values))

    @on(BookingsLoaded)
    def _bookings_loaded(self, message: BookingsLoaded) -> None:
        self.view = message.view
        self._clear_alert("service")
        self._recompute()
        self.board.show_bookings()
        self._warn_ending()
        self.bookings_signal.publish(message.view)
        # In file mode the user's own supervisors write the servers, which the service reports as bookings.
        self._servers.wake()

    @on(AlertsLoaded)
    def _alerts_loaded(self, message: AlertsLoaded) -> None:
        self.alerts_line = message.line
        self._sync_headers()

    @on(ServersChanged)
    def _servers_changed(self, message: ServersChanged) -> None:
        self._servers.wake()

    @on(ServersLoaded)
    def _servers_loaded(self, message: ServersLoaded) -> None:
        self.servers_view = message.view
        self.servers_signal.publish(message.view)

    @on(Notice)
    def _notice(self, message: Notice) -> None:
        self.notify(inert(message.text, 300), title="board", severity="warning", timeout=30, markup=False)

    @on(TelemetryFailed)
    def _telemetry_failed(self, message: TelemetryFailed) -> None:
        self._set_alert(f"telemetry failed: {inert(message.error, 80)}", "telemetry")

    @on(DatabaseFailed)
    def _database_failed(self, message: DatabaseFailed) -> None:
        # The CLI's own words ("board: the board service is not running ..."): it is the service, not the bookings.
        self._set_alert(f"board: {inert(message.error, 100)}", "service")

    def _set_alert(self, text: str, source: str) -> None:
        self._alert_from = source if text else ""
        if text != self.alert:
            self.alert = text
            self._sync_headers()
            self.board.show_alert()

    def _clear_alert(self, source: str) -> None:
        if self._alert_from == source:
            self._set_alert("", "")

    def _sync_headers(self) -> None:
        """Every screen's header shows the same fleet, trouble and alerts."""
        for screen in self.screen_stack:
            for header in screen.query(BoardHeader):
                header.sync()

    def _recompute(self) -> None:
        if self.fleet is None:
            return
        upcoming = tuple(self.view.upcoming if self.view else ())
        now, hot = self.clock(), self.config.hot_celsius
        self.statuses = fleet_status(self.fleet, upcoming, now, hot_celsius=hot, labels=self.config.labels,
                                     host=self.fleet_host)
        for other in self.hosts:  # bookings name cards by UUID, unique across hosts
            self.statuses += fleet_status(other.snapshot, upcoming, now, hot_celsius=hot, host=other.host,
                                          down_since=other.down_since)

    def _tick_if_idle(self) -> None:
        """The 1 s timer only has work when telemetry did not just tick (a stalled driver, a slow refresh)."""
        if time.monotonic() - self._last_tick >= 0.9:
            self._tick()

    def _tick(self) -> None:
        self._last_tick = time.monotonic()
        now = self.clock()
        for screen in self.screen_stack:
            for header in screen.query(BoardHeader):
                header.now = now
        self.board.tick(now)
        stalled = time.monotonic() - self.last_telemetry
        # With the service down no telemetry comes either: its line says why, and stays.
        if stalled > max(STALL_ALERT_SECONDS, 3 * self.refresh_seconds) and self._alert_from != "service":
            what = "telemetry stalled" if self.fleet is not None else "telemetry: no answer from the GPU driver"
            self._set_alert(f"{what} for {stalled:.0f} s; keys still work", "telemetry")
        self._warn_ending()

    def _warn_ending(self) -> None:
        """A toast, once per booking (and end), when one of mine ends within ten minutes."""
        if self.view is None:
            return
        now = self.clock()
        for booking in self.view.upcoming:
            if booking.uid != self.identity.uid or not booking.active(now):
                continue
            left = booking.end - now
            if 0 < left <= ENDING_SOON_SECONDS and (booking.id, booking.end) not in self.warned:
                self.warned.add((booking.id, booking.end))
                self.notify(
                    f"Your booking #{booking.id} on {cards_text(booking.cards, booking.host, self.fleet_host)}"
                    f" ends at {short_time(booking.end, now)}"
                    f" (in {max(1, round(left / 60))} min). Extend it from My bookings (m).",
                    title="Booking ending", severity="warning", timeout=30, markup=False,
                )

    # -- actions -------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The app's keys do nothing under a modal (the form, a confirmation): no form on top of a form.
        if action in ("book", "my_bookings", "help", "admin", "servers", "quit_board") and isinstance(
            self.screen, ModalScreen
        ):
            return False
        if action == "admin" and not self.identity.is_admin:
            return False
        return True

    def action_quit_board(self) -> None:
        self.exit(0)

    def draft(self) -> BookingDraft:
        """What `b` books: the timeline's selection when it has focus or a selection, else the highlighted card."""
        from app.tui.screens.booking_form import BookingDraft

        if not isinstance(self.screen, BoardScreen):
            return BookingDraft()
        timeline, now = self.board.timeline, self.clock()
        if timeline.has_focus or timeline.model.anchor is not None:
            selected = timeline.model.selected_range()
            if selected:
                cards, start, end = selected
                host = timeline.model.selected_host()
                if end <= now:
                    return BookingDraft(cards=tuple(cards), host=host)
                return BookingDraft(cards=tuple(cards), host=host, start=max(start, int(now)) if start > now else None,
                                    end=end)
        status = self.board.card_table.status_at_cursor()
        if status is None:
            return BookingDraft()
        return BookingDraft(cards=(status.reading.index,), host=self.remote(status.host))

    def remote(self, host: str) -> str | None:
        """`host` when it is another host than this one, else None (a plain card number means this host's)."""
        return host if host not in ("", self.fleet_host) else None

    @work(exit_on_error=False, group="book")
    async def action_book(self) -> None:
        from app.tui.screens.booking_form import BookingModal

        booked = await self.push_screen_wait(BookingModal(self.backend, self.draft()))
        if booked is not None:
            booking, now = booked.booking, self.clock()
            self.notify(
                f"Booked #{booking.id}: {cards_text(booking.cards, booking.host, self.fleet_host)}"
                f", {short_time(booking.start, now)} → {short_time(booking.end, now)}",
                title="Booked", markup=False,
            )
            # What runs on the cards now (passed over, or another user's processes on a named card). The
            # notes carry other users' names: plain text, never markup.
            for note in booked.notes:
                self.notify(inert(note, 300), title=f"Booking #{booking.id}", severity="warning", timeout=20,
                            markup=False)
            if isinstance(self.screen, BoardScreen):
                self.board.timeline.action_clear_selection()

    def action_my_bookings(self) -> None:
        from app.tui.screens.my_bookings import MyBookingsScreen

        if not isinstance(self.screen, MyBookingsScreen):
            self.push_screen(MyBookingsScreen())

    def action_card_detail(self, uuid: str) -> None:
        from app.tui.screens.card_detail import CardDetailScreen

        self.push_screen(CardDetailScreen(uuid))

    def action_admin(self) -> None:
        if not self.identity.is_admin:
            return
        from app.tui.screens.admin import AdminScreen

        if not isinstance(self.screen, AdminScreen):
            self.push_screen(AdminScreen())

    def action_servers(self) -> None:
        from app.tui.screens.servers import ServersScreen

        if not isinstance(self.screen, ServersScreen):
            self.push_screen(ServersScreen())

    def action_help(self) -> None:
        from app.tui.screens.help import HelpModal

        self.push_screen(HelpModal(admin=self.identity.is_admin))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield SystemCommand("Book cards", "Open the booking form", self.action_book)
        yield SystemCommand("My bookings", "Cancel, release or extend your bookings", self.action_my_bookings)
        if isinstance(screen, BoardScreen):
            yield SystemCommand("Timeline: now", "Jump the timeline to now", screen.action_now)
            yield SystemCommand("Timeline: zoom", "Cycle hours, day and week", screen.action_zoom)
            status = screen.card_table.status_at_cursor()
            if status is not None:
                yield SystemCommand(f"Card {status.reading.index} detail", "Processes, history and bookings",
                                    lambda: self.action_card_detail(status.reading.uuid))
        yield SystemCommand("Servers", "llama-server on your booked cards", self.action_servers)
        if self.identity.is_admin:
            yield SystemCommand("Admin", "All bookings, reassign, cancel, audit log", self.action_admin)
        yield SystemCommand("Help", "Every key", self.action_help)
        yield from super().get_system_commands(screen)


def run_board(ctx) -> int:
    """`board` with no subcommand (app.cli.cmd_board)."""
    from app.core.identity import Identity

    client = ctx.client
    me = client.call("whoami")  # the service says who we are, and opens (and seeds) a local database first
    identity = Identity(me["user"], me["uid"], me["admin"])
    app = BoardApp(client, identity=identity, config=ctx.config)
    # A closed terminal, SIGHUP or SIGTERM ends the board (app.tui.hangup says why Textual alone doesn't).
    with ending_on_hangup(lambda code: app.call_from_thread(app.exit, code, code)):
        result = app.run()
    return 0 if result is None else int(result)


__all__ = ["BoardApp", "run_board"]

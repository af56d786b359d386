"""My bookings: every live booking of mine from now on; cancel, release and extend, each confirmed first."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from app.core.text import host_cards
from app.errors import BoardError
from app.model import Booking
from app.tui.node import BoardNode
from app.tui.render import NOTICE_MARK, TIME_WIDTH, duration, short_time, under_cursor, untrusted
from app.tui.screens.confirm import ConfirmModal, ExtendModal, describe
from app.tui.widgets.header import BoardHeader
from app.tui.widgets.table import MeasuredTable


class MyBookingsScreen(BoardNode, Screen):
    DEFAULT_CSS = """
    MyBookingsScreen #title { height: 1; padding: 0 1; text-style: bold; background: $primary-muted; }
    MyBookingsScreen DataTable { height: 1fr; }
    MyBookingsScreen #empty { padding: 1 2; color: $text-muted; }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("c", "cancel", "Cancel"),
        Binding("r", "release", "Release"),
        Binding("e", "extend", "Extend"),
    ]

    def compose(self) -> ComposeResult:
        yield BoardHeader()
        yield Static(Text("My bookings"), id="title")
        yield MeasuredTable(cursor_type="row", id="mine")
        yield Static("", id="empty")
        yield Footer()

    def on_mount(self) -> None:
        app = self.app
        table = self.query_one(DataTable)
        for key, label, width in (("id", "#", 5), ("cards", "CARDS", 9), ("start", "START", TIME_WIDTH),
                                  ("end", "END", TIME_WIDTH), ("length", "FOR", 7), ("class", "CLASS", 10), ("state", "STATE", 8),
                                  ("note", "NOTE", None)):
            table.add_column(label, key=key, width=width)
        self.refresh_rows()
        app.bookings_signal.subscribe(self, lambda _: self.refresh_rows())
        table.focus()

    def mine(self) -> list[Booking]:
        view, me = self.app.view, self.app.identity
        if view is None:
            return []
        now = self.app.clock()
        return [b for b in view.upcoming if b.uid == me.uid and b.user == me.name and b.end > now]

    def refresh_rows(self) -> None:
        table = self.query_one(DataTable)
        now = self.app.clock()
        bookings = self.mine()
        keys = [str(b.id) for b in bookings]
        current = [k.value for k in table.rows]
        row = table.cursor_row
        if keys != current:
            table.clear()
        for b in bookings:
            cells = (
                Text(str(b.id)), Text(host_cards(b.cards, b.host, self.app.fleet_host)), Text(short_time(b.start, now)),
                Text(short_time(b.end, now)),
                Text(duration(b.end - b.start)), Text(b.klass),
                Text("ACTIVE" if b.active(now) else "queued" if b.queued else "upcoming"),
                noted(b),
            )
            if keys != current:
                table.add_row(*cells, key=str(b.id))
            else:
                for column, cell in zip(("id", "cards", "start", "end", "length", "class", "state", "note"), cells):
                    table.update_cell(str(b.id), column, cell)
        if keys != current and bookings:
            table.move_cursor(row=min(row, len(bookings) - 1))
        self.query_one("#empty", Static).update(
            Text("" if bookings else "You have no bookings from now on. Press b to book cards."))

    def selected(self) -> Booking | None:
        bookings = {str(b.id): b for b in self.mine()}
        return under_cursor(self.query_one(DataTable), bookings)

    def action_cancel(self) -> None:
        self._confirm_and_run("cancel")

    def action_release(self) -> None:
        self._confirm_and_run("release")

    @work(exit_on_error=False)
    async def _confirm_and_run(self, verb: str) -> None:
        booking = self.selected()
        if booking is None:
            self.app.bell()
            return
        now = self.app.clock()
        if verb == "release" and not booking.active(now):
            self.notify("It has not started yet; cancel it instead (c).", severity="warning", markup=False)
            return
        title = {"cancel": "Cancel this booking?", "release": "Release the cards now?"}[verb]
        body = describe(booking, now, self.app.fleet_host)
        if not await self.app.push_screen_wait(ConfirmModal(title, body, yes=verb.capitalize())):
            return
        try:
            action = self.app.backend.cancel if verb == "cancel" else self.app.backend.release
            done = await action(booking.id)
        except BoardError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        past = {"cancel": "cancelled", "release": "released"}[verb]
        self.notify(f"{past} booking #{done.id}", markup=False)

    @work(exit_on_error=False)
    async def action_extend(self) -> None:
        booking = self.selected()
        if booking is None:
            self.app.bell()
            return
        end = await self.app.push_screen_wait(ExtendModal(booking, self.app.clock()))
        if end is None:
            return
        try:
            done = await self.app.backend.extend(booking.id, end)
        except BoardError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        self.notify(f"booking #{done.id} now ends {short_time(done.end, self.app.clock())}", markup=False)


def noted(booking: Booking) -> Text:
    """The note, after what someone else last did to the booking (an admin, the backfill), marked as in the timeline."""
    text = Text()
    if booking.notice:
        text.append_text(untrusted(f"{NOTICE_MARK} {booking.notice}", 100, "bold yellow"))
        if booking.note:
            text.append(" · ")
    if booking.note:
        text.append_text(untrusted(booking.note, 60))
    return text

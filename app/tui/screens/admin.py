"""The admin screen: every booking (reassign, cancel anyone's) and the audit log. Admins only.

The app binds `a` and offers the palette command only for admins; this screen also refuses
to open for anyone else, and the core checks again on every change (NotPermitted).
"""

from __future__ import annotations

import json

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from app.errors import BoardError, NotPermitted
from app.core.text import cards_text, format_cards, inert
from app.model import Booking
from app.tui.node import BoardNode
from app.tui.render import TIME_WIDTH, holder, short_time, under_cursor, untrusted
from app.tui.screens.confirm import ConfirmModal, ReassignModal, describe
from app.tui.widgets.header import BoardHeader
from app.tui.widgets.table import MeasuredTable

PAST_SECONDS = 86400


class AdminScreen(BoardNode, Screen):
    DEFAULT_CSS = """
    AdminScreen .section { height: 1; padding: 0 1; text-style: bold; background: $error-muted; }
    AdminScreen #all-bookings { height: 1fr; }
    AdminScreen #audit { height: 1fr; }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("c", "cancel", "Cancel", tooltip="Cancel anyone's booking"),
        Binding("r", "reassign", "Reassign"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.bookings: dict[str, Booking] = {}

    def compose(self) -> ComposeResult:
        yield BoardHeader()
        yield Static(Text("All bookings (from yesterday on) · c cancel · r reassign"), classes="section")
        yield MeasuredTable(cursor_type="row", id="all-bookings")
        yield Static(Text("Audit log (newest first)"), classes="section")
        yield MeasuredTable(cursor_type="row", id="audit")
        yield Footer()

    def on_mount(self) -> None:
        app = self.app
        if not app.identity.is_admin:  # never reached through the UI: the key is not bound
            raise NotPermitted("the admin screen is for admins only")
        table = self.query_one("#all-bookings", DataTable)
        for key, label, width in (("id", "#", 5), ("user", "USER", 12), ("cards", "CARDS", 8), ("start", "START", TIME_WIDTH),
                                  ("end", "END", TIME_WIDTH), ("class", "CLASS", 10), ("status", "STATUS", 9),
                                  ("note", "NOTE", None)):
            table.add_column(label, key=key, width=width)
        audit = self.query_one("#audit", DataTable)
        for key, label, width in (("time", "TIME", 10), ("actor", "ACTOR", 12), ("action", "ACTION", 9),
                                  ("booking", "#", 5), ("outcome", "OUTCOME", None)):
            audit.add_column(label, key=key, width=width)
        # After the first refresh: the screen shows before its rows are read. Rows drawn before their table measures
        # them are redrawn at the measured widths (MeasuredTable).
        self.call_after_refresh(self.reload)
        app.bookings_signal.subscribe(self, lambda _: self.reload())
        table.focus()

    @work(exclusive=True, group="admin-load", exit_on_error=False)
    async def reload(self) -> None:
        now = self.app.clock()
        try:
            bookings = await self.app.backend.all_bookings(int(now) - PAST_SECONDS)
            log = await self.app.backend.audit_log(200)
        except BoardError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        table = self.query_one("#all-bookings", DataTable)
        row = table.cursor_row
        table.clear()
        self.bookings = {}
        for b in bookings:
            state = "cancelled" if b.status == "cancelled" else ("ACTIVE" if b.active(now) else
                                                                  ("ended" if b.end <= now else "upcoming"))
            table.add_row(
                Text(str(b.id)), untrusted(holder(b, 12), 12), Text(format_cards(b.cards)), Text(short_time(b.start, now)),
                Text(short_time(b.end, now)), Text(b.klass), Text(state, "dim" if state in ("cancelled", "ended") else ""),
                untrusted(b.note, 80), key=str(b.id),
            )
            self.bookings[str(b.id)] = b
        if bookings:
            table.move_cursor(row=min(max(row, 0), len(bookings) - 1))
        audit = self.query_one("#audit", DataTable)
        audit.clear()
        for e in log:
            if e.ok:
                outcome = Text("ok", "green")
                extra = {k: v for k, v in e.details.items() if k in ("cards", "user", "old_cards", "old_user")}
                if extra:
                    outcome.append(" ")
                    outcome.append_text(untrusted(json.dumps(extra, ensure_ascii=False), 80))
            else:
                outcome = Text("REFUSED ", "bold red").append_text(untrusted(str(e.details.get("refused", "")), 120))
            audit.add_row(
                Text(short_time(e.ts, now)), untrusted(e.actor, 12), Text(e.action),
                Text("" if e.booking_id is None else str(e.booking_id)), outcome,
            )

    def selected(self) -> Booking | None:
        return under_cursor(self.query_one("#all-bookings", DataTable), self.bookings)

    @work(exit_on_error=False)
    async def action_cancel(self) -> None:
        booking = self.selected()
        now = self.app.clock()
        if booking is None or booking.status == "cancelled" or booking.end <= now:
            self.app.bell()
            return
        body = describe(booking, now, self.app.fleet_host)
        if not await self.app.push_screen_wait(ConfirmModal("Cancel this booking?", body, yes="Cancel")):
            return
        try:
            done = await self.app.backend.cancel(booking.id)
        except BoardError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        self.notify(f"cancelled booking #{done.id}", markup=False)
        self.reload()

    @work(exit_on_error=False)
    async def action_reassign(self) -> None:
        booking = self.selected()
        now = self.app.clock()
        if booking is None or booking.status == "cancelled" or booking.end <= now:
            self.app.bell()
            return
        answer = await self.app.push_screen_wait(ReassignModal(booking, now))
        if answer is None:
            return
        cards, user = answer
        try:
            done = await self.app.backend.reassign(booking.id, cards=cards, user=user)
        except BoardError as error:
            self.notify(str(error), severity="error", markup=False)
            return
        self.notify(f"booking #{done.id} is now {inert(done.user, 16)}'s on {cards_text(done.cards)}", markup=False)
        self.reload()

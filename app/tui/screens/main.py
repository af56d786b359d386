"""The board: header, live card table, timeline and a line describing what the cursor is on; on a tall terminal
the active and upcoming bookings under them."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Static

from app.core.policy import policy_zone, pool_rules
from app.core.text import cards_text, host_cards, inert
from app.tui.node import BoardNode
from app.tui.render import duration, short_time
from app.tui.screens.confirm import describe
from app.tui.card_table_model import WIDE_MIN_WIDTH
from app.tui.widgets.card_table import CardTable
from app.tui.widgets.footer import BoardFooter
from app.tui.widgets.header import BoardHeader
from app.tui.widgets.timeline import Timeline
from app.tui.widgets.upcoming import UpcomingTable


class BoardScreen(BoardNode, Screen):
    DEFAULT_CSS = """
    BoardScreen { layout: vertical; }
    BoardScreen #detail { height: 1; padding: 0 1; background: $panel; color: $foreground; }
    BoardScreen #detail.-alert { color: $error; text-style: bold; }
    BoardScreen #upcoming-title { height: 1; padding: 0 1; color: $text-muted; text-style: bold; display: none; }
    BoardScreen #upcoming { display: none; }
    BoardScreen.-tall Timeline { height: auto; max-height: 50%; }
    BoardScreen.-tall #upcoming-title, BoardScreen.-tall #upcoming { display: block; }
    """
    TALL_MIN_HEIGHT = 34
    BINDINGS = [
        Binding("t", "now", "Now", tooltip="Timeline: jump to now"),
        Binding("z", "zoom", "Zoom", tooltip="Timeline: hours, day, week"),
        Binding("left_square_bracket", "day(-1)", "-day", show=False),
        Binding("right_square_bracket", "day(1)", "+day", show=False),
    ]

    def compose(self) -> ComposeResult:
        app = self.app
        yield BoardHeader(id="header")
        yield CardTable(app.identity.name, id="cards")
        yield Timeline(app.identity.name, app.clock(), pools=app.config.pools, zone=policy_zone(app.config),
                       projects=app.config, id="timeline")
        yield Static("", id="detail")
        yield BoardFooter()  # the upcoming table goes above it once the terminal is tall (on_resize)

    def on_mount(self) -> None:
        self.query_one(CardTable).focus()

    @property
    def timeline(self) -> Timeline:
        return self.query_one(Timeline)

    @property
    def card_table(self) -> CardTable:
        return self.query_one(CardTable)

    # -- keys ----------------------------------------------------------------------------------

    def action_now(self) -> None:
        self.timeline.jump_to_now()

    def action_zoom(self) -> None:
        self.timeline.cycle_zoom()

    def action_day(self, days: int) -> None:
        self.timeline.shift_days(days)

    @on(CardTable.RowSelected, "#cards")
    def _card_chosen(self, event: CardTable.RowSelected) -> None:
        self.app.action_card_detail(event.uuid)

    def key_enter(self) -> None:
        model = self.timeline.model
        if self.timeline.has_focus and model.rows:
            self.app.action_card_detail(model.rows[model.cursor[0]].uuid)

    # -- what the cursor is on -----------------------------------------------------------------

    @on(Timeline.CursorMoved)
    def _cursor_moved(self, event: Timeline.CursorMoved) -> None:
        self.describe_cursor()

    @on(Timeline.ViewChanged)
    def _view_changed(self, event: Timeline.ViewChanged) -> None:
        self.app.set_window(event.start, event.end)

    def describe_cursor(self) -> None:
        """The line under the timeline: the alert, the selection, or the booking under the cursor.

        Called on every telemetry and bookings update, so it repaints only when the line changes."""
        alert, text = bool(self.app.alert), self._cursor_text()
        if (alert, text) == getattr(self, "_described", None):
            return
        self._described = (alert, text)
        detail = self.query_one("#detail", Static)
        detail.set_class(alert, "-alert")
        detail.update(text if text is not None else "")

    def _cursor_text(self) -> Text | None:
        model, now = self.timeline.model, self.app.clock()
        if self.app.alert:
            return Text(self.app.alert)
        selection = model.selected_range()
        if model.anchor is not None and selection:
            cards, start, end = selection
            return Text(
                f"selected {cards_text(cards, model.selected_host() or '')} · {short_time(start, now)}"
                f" → {short_time(end, now)} ({duration(end - start)}) · b books it")
        booking = model.booking_at(*model.cursor)
        if booking is not None:
            return describe(booking, now, self.app.fleet_host)
        if selection:
            cards, start, _ = selection
            named = host_cards(cards, model.selected_host() or "")
            held = model.held_at(*model.cursor)
            if held is not None:  # whose the card is over these hours, before a refusal says so
                return Text(f"card {named} free at {short_time(start, now)} · {inert(held.words(model.zone), 120)}"
                            " · b books")
            pool = model.pool_of(model.cursor[0])
            if pool is not None:  # the rules before the booking, not in its refusal
                return Text(f"card {named} free at {short_time(start, now)} · "
                            f"{inert(pool.name, 20)}: {pool_rules(pool)} · b books")
            return Text(f"card {named} free at {short_time(start, now)} · "
                        f"shift+arrows or drag to select · b books")
        return None

    # -- data from the app ---------------------------------------------------------------------

    @property
    def torn_down(self) -> bool:
        """The app is exiting and has removed this screen's widgets; pollers may still deliver."""
        return not self.query(BoardHeader)

    def show_fleet(self) -> None:
        app = self.app
        snapshot = app.fleet
        if snapshot is None or self.torn_down:
            return
        wide = app.size.width >= WIDE_MIN_WIDTH
        cards = [*snapshot.cards, *(card for other in app.hosts for card in other.snapshot.cards)]
        hosts = [None] * len(snapshot.cards) + [app.remote(other.host) for other in app.hosts
                                                for _ in other.snapshot.cards]
        self.timeline.set_cards(cards, app.config.labels, wide=wide, hosts=hosts, here=app.fleet_host)
        self.card_table.show(app.statuses, app.clock())
        self.describe_cursor()  # the cards may have arrived after the bookings

    def show_bookings(self) -> None:
        if self.torn_down:
            return
        view = self.app.view
        if view is not None:
            self.timeline.set_bookings(view.window)
            if self.has_class("-tall"):
                self.query_one(UpcomingTable).show(view.upcoming, self.app.clock(), self.app.fleet_host)
            self.describe_cursor()  # the booking under the cursor may have changed
        self.card_table.show(self.app.statuses, self.app.clock())

    def tick(self, now: float) -> None:
        if self.torn_down:
            return
        self.query_one(BoardHeader).now = now
        self.timeline.set_now(now)
        if self.has_class("-tall") and self.app.view is not None:  # time left, and ended bookings leave
            self.query_one(UpcomingTable).show(self.app.view.upcoming, now, self.app.fleet_host)

    def show_alert(self) -> None:
        if not self.torn_down:
            self.describe_cursor()

    async def on_resize(self) -> None:
        tall = self.app.size.height >= self.TALL_MIN_HEIGHT
        if tall and not self.query(UpcomingTable):  # built when first shown: at 80x24 the first paint needs none
            await self.mount(Static(Text("Active and upcoming bookings"), id="upcoming-title"),
                             UpcomingTable(self.app.identity.name, id="upcoming"), after="#detail")
        self.set_class(tall, "-tall")
        self.show_fleet()
        self.show_bookings()

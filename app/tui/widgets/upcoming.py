"""Active and upcoming bookings on all cards, soonest first: fills the space a large terminal has below the timeline."""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual.widgets import DataTable

from app.core.text import host_cards
from app.model import Booking
from app.tui.render import TIME_WIDTH, duration, holder, short_time, untrusted
from app.tui.widgets.table import MeasuredTable

NOTE_WIDTH = 100  # the note's limit: a fixed width, as an auto one is measured by whatever the console is at the time


class UpcomingTable(MeasuredTable):
    DEFAULT_CSS = """
    UpcomingTable { height: 1fr; }
    UpcomingTable > .upcoming--active { color: $success; text-style: bold; }
    UpcomingTable > .upcoming--later { color: $text-muted; }
    """
    COMPONENT_CLASSES = DataTable.COMPONENT_CLASSES | {"upcoming--active", "upcoming--later"}
    COLUMNS = (("id", "#", 5), ("user", "USER", 12), ("cards", "CARDS", 9), ("start", "START", TIME_WIDTH),
               ("end", "END", TIME_WIDTH), ("length", "FOR", 6), ("when", "WHEN", 12), ("class", "CLASS", 10),
               ("note", "NOTE", NOTE_WIDTH))

    def __init__(self, me: str, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", show_cursor=False)
        self.me = me
        self._shown: tuple | None = None

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)

    def show(self, bookings: Sequence[Booking], now: float, here: str = "") -> None:
        """The bookings not yet over at `now`; an active one says how long it has left, a later one how soon it starts.
        Another host's cards than `here` read 'gpu2:0,1'."""
        bookings = [b for b in bookings if b.end > now]
        key = (tuple((b.id, b.start, b.end, b.user, b.project, b.note, b.cards, b.host) for b in bookings), int(now // 60),
               here)
        if key == self._shown:
            return
        self._shown = key
        active, later = self.get_component_rich_style("upcoming--active"), self.get_component_rich_style("upcoming--later")
        self.clear()
        for b in bookings:
            state = "bold" if b.user == self.me else ""
            if b.start <= now:
                when = Text(f"{duration(b.end - now)} left", style=active)
            else:
                when = Text(f"in {duration(b.start - now)}", style=later)
            self.add_row(
                Text(str(b.id)), untrusted(holder(b, 12), 12, state), Text(host_cards(b.cards, b.host, here)),
                Text(short_time(b.start, now)), Text(short_time(b.end, now)), Text(duration(b.end - b.start)), when,
                Text(b.klass), untrusted(b.note, NOTE_WIDTH), key=str(b.id),
            )

"""Upcoming bookings on all cards, soonest first: fills the space a large terminal has below the timeline."""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual.widgets import DataTable

from app.core.text import format_cards
from app.model import Booking
from app.tui.render import duration, short_time, untrusted


class UpcomingTable(DataTable):
    DEFAULT_CSS = """
    UpcomingTable { height: 1fr; }
    """
    COLUMNS = (("id", "#", 5), ("user", "USER", 12), ("cards", "CARDS", 9), ("start", "START", 10),
               ("end", "END", 10), ("length", "FOR", 6), ("class", "CLASS", 10), ("note", "NOTE", None))

    def __init__(self, me: str, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", show_cursor=False)
        self.me = me
        self._shown: tuple | None = None

    def on_mount(self) -> None:
        for key, label, width in self.COLUMNS:
            self.add_column(label, key=key, width=width)

    def show(self, bookings: Sequence[Booking], now: float) -> None:
        key = (tuple((b.id, b.start, b.end, b.user, b.note, b.cards) for b in bookings), int(now // 60))
        if key == self._shown:
            return
        self._shown = key
        self.clear()
        for b in bookings:
            state = "bold" if b.user == self.me else ""
            self.add_row(
                Text(str(b.id)), untrusted(b.user, 12, state), Text(format_cards(b.cards)),
                Text(short_time(b.start, now)), Text(short_time(b.end, now)), Text(duration(b.end - b.start)),
                Text(b.klass), untrusted(b.note, 100), key=str(b.id),
            )

"""Small pure helpers that turn board data into Rich Text for the widgets.

Anything another user typed (names, notes, command lines) goes through `untrusted`, which
makes it inert with app.core.text.inert and wraps it in a plain `Text`: never markup, never
escapes. Styles here are names of theme-aware component classes or plain attributes; colours
come from the .tcss files and widgets' DEFAULT_CSS.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text

from app.core.text import format_duration, inert

if TYPE_CHECKING:
    from textual.widgets import DataTable

    from app.model import Booking

T = TypeVar("T")

NA = "n/a"


def untrusted(text: str | None, limit: int | None = None, style: Style | str = "") -> Text:
    """Another user's text as inert plain Text (control, bidi and zero-width characters made visible)."""
    return Text(inert(text or "", limit), style=style, no_wrap=True, overflow="ellipsis")


def holder(booking: Booking, limit: int | None = 16) -> str:
    """'alice', or 'alice·A' on a board with projects (the booking's project beside its holder), inert, in at most
    `limit` characters: the project gives way first ('alice·res…'), then goes ('alice'), before the name does. A board
    without projects has no booking with a project: its names read as they always did."""
    both = inert(f"{booking.user}·{booking.project}", limit)
    if not booking.project or (limit is not None and both.endswith("…") and len(inert(booking.user)) + 3 > limit):
        return inert(booking.user, limit)
    return both


def abbreviate(text: str, width: int) -> str:
    """`text` in at most `width` cells: whole when it fits, else its start and its end around "…", since
    card labels lead with a slot or name and end with what tells them apart (a serial, a number)."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    tail_room = (width - 1) // 2
    head, tail = "", ""
    for ch in text:
        if cell_len(head + ch) > width - 1 - tail_room:
            break
        head += ch
    for ch in reversed(text):
        if cell_len(head + tail + ch) > width - 1:
            break
        tail = ch + tail
    return f"{head}…{tail}"


def local(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch).astimezone()


TIME_WIDTH = 11  # a column of short_time's: its longest form, "12-01 14:00"


def short_time(epoch: float, now: float) -> str:
    """'14:00' today, 'Tue 14:00' within a week either way, else '12-01 14:00'."""
    moment, today = local(epoch), local(now).date()
    days = (moment.date() - today).days
    if days == 0:
        return moment.strftime("%H:%M")
    if -7 < days < 7:
        return moment.strftime("%a %H:%M")
    return moment.strftime("%m-%d %H:%M")


def full_time(epoch: float) -> str:
    """A time the booking form's start and end fields read back: '2026-11-29 16:00'."""
    return local(epoch).strftime("%Y-%m-%d %H:%M")


duration = format_duration  # the same forms the time parser reads, as the CLI prints them
NOTICE_MARK = "⚑"  # on a booking someone else changed (an admin, the backfill): its holder should look


def bar(fraction: float | None, width: int) -> str:
    """A horizontal bar in eighths: '█████▍  '."""
    if fraction is None:
        return " " * width
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")
    return text.ljust(width)[:width]


def gib(mib: int | None) -> str:
    return NA if mib is None else f"{mib / 1024:.1f}"


def level_style(fraction: float | None, warn: float, danger: float) -> str:
    """A component-class suffix for a value: 'ok', 'warn' or 'danger'."""
    if fraction is None:
        return "na"
    if fraction >= danger:
        return "danger"
    if fraction >= warn:
        return "warn"
    return "ok"


def under_cursor(table: DataTable, rows: Mapping[str, T]) -> T | None:
    """What `rows` holds for the row key under a DataTable's cursor; None when the table is empty."""
    if table.row_count == 0 or table.cursor_row < 0:
        return None
    from textual.coordinate import Coordinate  # here: the models import this module without textual

    key = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0)).row_key.value
    return rows.get(key) if key is not None else None

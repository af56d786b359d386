"""The timeline calendar: cards down, time across, bookings as coloured blocks.

The pools' rules are drawn too, so nobody learns them by being refused: each pool's cards are shaded
alike, and under the time axis one row per pool says which classes it takes in each stretch of time,
with a mark where a class window opens or closes.

Built for thousands of bookings. `set_bookings` paints an owner grid (row x column -> booking)
once per data change; each visible line is then a precomputed `Strip` of run-length segments,
so a repaint is a list lookup. Cursor moves rebuild only the lines they touch.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta, tzinfo
from typing import Sequence

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from app.config import CLASSES, Pool
from app.core.policy import open_classes
from app.core.text import inert
from app.gpu.model import CardReading
from app.model import Booking
from app.tui.render import NOTICE_MARK, abbreviate, local

AXIS_ROWS = 2
DAY = 86400


@dataclass(frozen=True, slots=True)
class Zoom:
    name: str
    step: int  # seconds per column
    columns: int
    before: int  # how much of the past the default view shows


ZOOMS = (
    Zoom("hours", 600, 36, 3600),  # 6 h at 10 minutes
    Zoom("day", 1800, 48, 2 * 3600),  # 2 h ago to 22 h ahead at 30 minutes
    Zoom("week", 3 * 3600, 56, DAY),  # a week at 3 hours
)
DEFAULT_ZOOM = 1


@dataclass(frozen=True, slots=True)
class Row:
    index: int
    uuid: str
    label: str
    lost: bool = False


# How a pools row names the classes allowed in a stretch of time, longest first, as room allows.
SHORT_CLASS = {"online": "on", "batch": "ba", "finetune": "ft", "experiment": "ex"}
POOL_SHADES = ("pool-a", "pool-b")  # alternate, so neighbouring pools part


def align(epoch: float, step: int) -> int:
    """Round down to a step boundary in local time, so 30-minute columns start at :00 and :30."""
    offset = local(epoch).utcoffset() or timedelta(0)
    shift = int(offset.total_seconds())
    return int((epoch + shift) // step * step - shift)


class Timeline(Widget, can_focus=True):
    DEFAULT_CSS = """
    Timeline { height: 1fr; min-height: 4; background: $surface; }
    Timeline:focus { background-tint: $foreground 3%; }
    Timeline > .timeline--axis { color: $text-muted; }
    Timeline > .timeline--day { color: $foreground; text-style: bold; }
    Timeline > .timeline--label { color: $foreground; }
    Timeline > .timeline--label-lost { color: $error; text-style: bold strike; }
    Timeline > .timeline--free { color: $panel-lighten-2; }
    Timeline > .timeline--past { color: $panel; background: $surface-darken-1; }
    Timeline > .timeline--online { background: $error-darken-1; color: $text; }
    Timeline > .timeline--batch { background: $warning-darken-2; color: $text; }
    Timeline > .timeline--finetune { background: $primary-darken-1; color: $text; }
    Timeline > .timeline--experiment { background: $success-darken-2; color: $text; }
    Timeline > .timeline--mine { text-style: bold underline; }
    Timeline > .timeline--now { color: $error; text-style: bold; }
    Timeline > .timeline--pool-a { background: $secondary 15%; }
    Timeline > .timeline--pool-b { background: $accent 12%; }
    Timeline > .timeline--rule { color: $text-muted; }
    Timeline > .timeline--rule-edge { color: $foreground; text-style: bold; }
    Timeline > .timeline--rule-online { color: $error-lighten-1; }
    Timeline > .timeline--rule-batch { color: $warning; }
    Timeline > .timeline--rule-finetune { color: $primary-lighten-2; }
    Timeline > .timeline--rule-experiment { color: $success-lighten-1; }
    Timeline > .timeline--selection { background: $accent 60%; color: $text; }
    Timeline > .timeline--cursor { background: $accent; color: $text; text-style: bold; }
    """
    COMPONENT_CLASSES = {
        "timeline--axis", "timeline--day", "timeline--label", "timeline--label-lost", "timeline--free",
        "timeline--past", "timeline--online", "timeline--batch", "timeline--finetune", "timeline--experiment",
        "timeline--mine", "timeline--now", "timeline--selection", "timeline--cursor", "timeline--pool-a",
        "timeline--pool-b", "timeline--rule", "timeline--rule-edge", "timeline--rule-online", "timeline--rule-batch",
        "timeline--rule-finetune", "timeline--rule-experiment",
    }
    BINDINGS = [
        Binding("left", "move(0, -1)", "Earlier", show=False),
        Binding("right", "move(0, 1)", "Later", show=False),
        Binding("up", "move(-1, 0)", "Card up", show=False),
        Binding("down", "move(1, 0)", "Card down", show=False),
        Binding("shift+left", "extend(0, -1)", "Select earlier", show=False),
        Binding("shift+right", "extend(0, 1)", "Select later", show=False),
        Binding("shift+up", "extend(-1, 0)", "Select card up", show=False),
        Binding("shift+down", "extend(1, 0)", "Select card down", show=False),
        Binding("space", "mark", "Start/stop a selection", show=False),
        Binding("escape", "clear_selection", "Clear selection", show=False),
    ]

    zoom_index: reactive[int] = reactive(DEFAULT_ZOOM, init=False)

    class ViewChanged(Message):
        """The window of time shown changed; the bookings poller loads that window."""

        def __init__(self, start: int, end: int) -> None:
            super().__init__()
            self.start, self.end = start, end

    class CursorMoved(Message):
        def __init__(self, booking: Booking | None, card: Row | None, start: int, end: int) -> None:
            super().__init__()
            self.booking, self.card, self.start, self.end = booking, card, start, end

    def __init__(self, me: str, now: float, *, pools: Sequence[Pool] = (), zone: tzinfo | None = None,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self.me = me
        self.now = now
        self.pools = tuple(pools)
        self.zone = zone  # where the pools' windows are read (app.core.policy.policy_zone)
        self.rows: list[Row] = []
        self._row_pool: list[int | None] = []  # each card row's pool, an index into pools
        self.pool_rows: list[int] = []  # the pools with cards in the fleet, one rules row each
        self._allowed: list[list[tuple[str, ...]]] = []  # per pools row, per column: the classes it takes
        self.bookings: tuple[Booking, ...] = ()
        self.view_start = align(now, ZOOMS[DEFAULT_ZOOM].step) - ZOOMS[DEFAULT_ZOOM].before
        self.cursor = (0, self._column_of(now))
        self.anchor: tuple[int, int] | None = None
        self.marking = False
        self.row_offset = 0
        self.label_width = 3
        self._grid: list[list[Booking | None]] = []
        self._lines: dict[int, Strip] = {}  # card row -> strip, built lazily
        self._axis: list[Strip] | None = None
        self._first_row: dict[tuple[int, int], bool] = {}
        self._styles: dict[str, Style] = {}
        self._width = 0

    # -- geometry ------------------------------------------------------------------------------

    @property
    def zoom(self) -> Zoom:
        return ZOOMS[self.zoom_index]

    @property
    def view_end(self) -> int:
        return self.view_start + self.zoom.step * self.zoom.columns

    def _column_of(self, epoch: float) -> int:
        return int((epoch - self.view_start) // self.zoom.step)

    def column_time(self, column: int) -> int:
        return self.view_start + column * self.zoom.step

    @property
    def cell_width(self) -> int:
        return max(1, (self.size.width - self.label_width) // self.zoom.columns)

    @property
    def axis_rows(self) -> int:
        """The time axis and the pools' rules rows above the cards."""
        return AXIS_ROWS + len(self.pool_rows)

    @property
    def visible_rows(self) -> int:
        return max(0, self.size.height - self.axis_rows)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.axis_rows + max(1, len(self.rows))

    def pool_of(self, row: int) -> Pool | None:
        """The pool a card row belongs to, if any."""
        if 0 <= row < len(self._row_pool) and self._row_pool[row] is not None:
            return self.pools[self._row_pool[row]]
        return None

    # -- data ----------------------------------------------------------------------------------

    def set_cards(self, cards: Sequence[CardReading], labels: dict[int, str] | None = None, wide: bool = False) -> None:
        """Rows for the cards, labelled 'index label' with the label shortened to fit (app.tui.render.abbreviate)."""
        labels = labels or {}
        named = [(card, inert(labels.get(card.index, card.label) or "")) for card in cards]
        widest = max((cell_len(f"{c.index} {name}".rstrip()) for c, name in named), default=1)
        pool_names = max((cell_len(inert(self.pools[p].name)) for p in self._pools_of(cards)), default=0)
        width = max(3, min(12 if wide else 9, max(widest, min(pool_names, 8)) + 1))
        rows = []
        for card, name in named:
            index = str(card.index)
            text = f"{index} {abbreviate(name, width - len(index) - 2)}" if name and width - len(index) > 3 else index
            rows.append(Row(card.index, card.uuid, text, card.lost))
        if rows != self.rows or width != self.label_width:
            self.rows = rows
            self.label_width = width
            # A card in two pools is shaded as the first one's (the policy applies both).
            pool_of = {card: n for n, pool in reversed(list(enumerate(self.pools))) for card in pool.cards}
            self._row_pool = [pool_of.get(r.index) for r in rows]
            self.pool_rows = sorted(p for p in set(self._row_pool) if p is not None)
            self.cursor = (min(self.cursor[0], max(0, len(rows) - 1)), self.cursor[1])
            self._rebuild_grid()
            self.refresh(layout=True)

    def _pools_of(self, cards: Sequence[CardReading]) -> set[int]:
        indexes = {c.index for c in cards}
        return {n for n, pool in enumerate(self.pools) if indexes & set(pool.cards)}

    def set_bookings(self, bookings: Sequence[Booking]) -> None:
        self.bookings = tuple(bookings)
        self._rebuild_grid()
        self._cursor_moved()

    def set_now(self, now: float) -> None:
        old = self._column_of(self.now)
        self.now = now
        if self._column_of(now) != old:
            self._invalidate()

    # -- painting ------------------------------------------------------------------------------

    def _rebuild_grid(self) -> None:
        """Which booking owns each (card row, column). A booking claims its cells unless an earlier one did."""
        columns, step, start = self.zoom.columns, self.zoom.step, self.view_start
        end = start + columns * step
        row_of = {r.uuid: i for i, r in enumerate(self.rows)}
        grid: list[list[Booking | None]] = [[None] * columns for _ in self.rows]
        for booking in self.bookings:
            if booking.end <= start or booking.start >= end or booking.status != "booked":
                continue
            c0 = max(0, (booking.start - start) // step)
            c1 = min(columns, -(-(booking.end - start) // step))
            for uuid in booking.card_uuids:
                row = row_of.get(uuid)
                if row is None:
                    continue
                cells = grid[row]
                if cells[c0] is None:
                    cells[c0] = booking
                for c in range(c0 + 1, c1):
                    if cells[c] is None:
                        cells[c] = booking
        self._grid = grid
        self._allowed = [[open_classes(self.pools[p], start + c * step, start + (c + 1) * step, self.zone)
                          for c in range(columns)] for p in self.pool_rows]
        self._invalidate()

    def _invalidate(self) -> None:
        self._lines.clear()
        self._axis = None
        self.refresh()

    def _refresh_rows(self, *rows: int) -> None:
        for row in rows:
            self._lines.pop(row, None)
        self.refresh()

    def _style(self, name: str) -> Style:
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(f"timeline--{name}")
        return style

    def _overlay(self, name: str) -> Style:
        """A component style without its background: the mark of the user's own blocks, for one."""
        key = f"{name}/fg"
        style = self._styles.get(key)
        if style is None:
            full = self._style(name)
            style = self._styles[key] = Style(
                color=full.color if name != "mine" else None, bold=full.bold, italic=full.italic,
                underline=full.underline, strike=full.strike, reverse=full.reverse,
            )
        return style

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._lines.clear()
        self._axis = None

    def _selection(self) -> tuple[int, int, int, int] | None:
        if self.anchor is None:
            return None
        (r0, c0), (r1, c1) = self.anchor, self.cursor
        return min(r0, r1), max(r0, r1), min(c0, c1), max(c0, c1)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if width != self._width:
            self._width = width
            self._lines.clear()
            self._axis = None
        if y < self.axis_rows:
            if self._axis is None:
                self._axis = self._build_axis() + [self._build_rules(n) for n in range(len(self.pool_rows))]
            return self._axis[y]
        row = y - self.axis_rows + self.row_offset
        if row >= len(self.rows):
            return Strip.blank(width, self.rich_style)
        line = self._lines.get(row)
        if line is None:
            line = self._lines[row] = self._build_row(row)
        return line

    def _block_label(self, booking: Booking, row: int, column: int) -> str:
        """The user on the top row of a block; lower rows of the same booking stay blank, so it reads as one."""
        if row > 0 and self._grid[row - 1][column] is booking:
            return ""
        label = inert(booking.user, 16)
        if booking.notice:  # someone else changed it: the detail line below says what
            label = f"{NOTICE_MARK} {label}"
        if len(booking.cards) > 1:
            label += f" ×{len(booking.cards)}"
        return label

    def _build_row(self, row: int) -> Strip:
        width, cw, lw = self.size.width, self.cell_width, self.label_width
        card = self.rows[row]
        cells = self._grid[row]
        now_col = self._column_of(self.now)
        selection = self._selection()
        in_selection = selection is not None and selection[0] <= row <= selection[1]
        cursor_col = self.cursor[1] if self.cursor[0] == row and self.has_focus else -1
        base = self.rich_style
        pool = self._row_pool[row] if row < len(self._row_pool) else None
        shade = self._style(POOL_SHADES[self.pool_rows.index(pool) % 2]) if pool is not None else Style()
        label_style = base + self._style("label-lost" if card.lost else "label") + shade
        segments = [Segment(set_cell_size(card.label, lw - 1), label_style), Segment(" ", base)]
        free, past, now_style = self._style("free") + shade, self._style("past"), self._overlay("now")
        mine, selected, cursor = self._overlay("mine"), self._style("selection"), self._style("cursor")
        columns = len(cells)

        def overlay(c: int) -> int:  # 0 none, 1 the now column, 2 selected, 3 the cursor
            if c == cursor_col:
                return 3
            if in_selection and selection[2] <= c <= selection[3]:
                return 2
            return 1 if c == now_col else 0

        column = 0
        block_start, block_text = 0, ""
        while column < columns:
            owner, kind, is_past = cells[column], overlay(column), column < now_col
            end = column + 1
            # A run: the same owner (by identity), overlay and past/future on every column of it.
            while end < columns and cells[end] is owner and overlay(end) == kind and (end < now_col) == is_past:
                end += 1
            span = (end - column) * cw
            if owner is None:
                style = base + (past if is_past else free)
                text = ("·" + " " * (cw - 1)) * (end - column)
            else:
                style = base + self._style(owner.klass if owner.klass in CLASSES else "experiment")
                if owner.user == self.me:
                    style += mine
                if column == 0 or cells[column - 1] is not owner:  # a block starts: its label spans its runs
                    block_start = column
                    label = self._block_label(owner, row, column)
                    block_text = ("▏" + label) if label else ""
                offset = (column - block_start) * cw
                text = block_text[offset:offset + span].ljust(span)
            if kind == 1 and owner is None:
                style += now_style
                text = "│" + text[1:]
            elif kind == 2:
                style += selected
            elif kind == 3:
                style += cursor
            segments.append(Segment(text, style))
            column = end
        legend = self._legend_segment(row, lw + columns * cw)
        if legend:
            segments.extend(legend)
            return Strip(segments, width).crop(0, width)
        used = lw + columns * cw
        if used < width:
            segments.append(Segment(" " * (width - used), base))
        return Strip(segments, width).crop(0, width)

    LEGEND = ("online", "batch", "finetune", "experiment")

    def _legend_segment(self, row: int, x: int) -> list[Segment]:
        """Right of the grid, where the terminal is wider than the columns: what the colours mean."""
        width = self.size.width
        room = width - x - 2
        if room < 12:
            return []
        base = self.rich_style
        if row < len(self.LEGEND):
            name = self.LEGEND[row]
            return [Segment(" " * 2, base), Segment("  ", base + self._style(name)),
                    Segment(f" {name}"[: room - 2].ljust(room - 2), base + self._style("axis"))]
        if row == len(self.LEGEND):
            return [Segment("  ", base), Segment("mine"[:room], base + self._style("axis") + self._overlay("mine")),
                    Segment(" = yours"[: max(0, room - 4)].ljust(max(0, room - 4)), base + self._style("axis"))]
        return []

    def _build_axis(self) -> list[Strip]:
        width, cw, lw = self.size.width, self.cell_width, self.label_width
        step, columns = self.zoom.step, self.zoom.columns
        base = self.rich_style
        axis, day_style, now_style = base + self._style("axis"), base + self._style("day"), base + self._style("now")
        top = [" "] * width
        bottom = [" "] * width
        top_styles: dict[int, Style] = {}
        # Day labels where the local date changes, and at the left edge if it fits before the next one.
        starts: list[tuple[int, object]] = []
        previous = None
        for c in range(columns):
            day = local(self.column_time(c)).date()
            if day != previous:
                starts.append((c, day))
                previous = day
        for n, (c, day) in enumerate(starts):
            x = lw + c * cw
            limit = lw + starts[n + 1][0] * cw - 1 if n + 1 < len(starts) else width
            text = ("|" if c > 0 else "") + day.strftime("%a %d %b")
            if limit - x < len(text):
                text = text[: max(0, limit - x)]
            if len(text) < 4 and c == 0:
                continue
            for i, ch in enumerate(text):
                if x + i < width:
                    top[x + i] = ch
                    top_styles[x + i] = day_style
        # Hour labels at a spacing that fits.
        for seconds in (1800, 3600, 7200, 10800, 21600, 43200, DAY):
            fmt = "%H:%M" if seconds < 3600 else "%H"
            need = len(fmt.replace("%H", "00").replace("%M", "00")) + 1
            if seconds % step == 0 and (seconds // step) * cw >= need:
                break
        grid_end = min(width, lw + columns * cw)
        for c in range(columns):
            t = self.column_time(c)
            moment = local(t)
            if (moment.hour * 3600 + moment.minute * 60) % seconds == 0:
                x = lw + c * cw
                text = moment.strftime(fmt)
                if x + len(text) <= grid_end:
                    bottom[x:x + len(text)] = text
        now_col = self._column_of(self.now)
        zoom = f"  zoom {self.zoom.name}"
        right = lw + columns * cw
        if width - right >= len(zoom):
            for i, ch in enumerate(zoom):
                bottom[right + i] = ch
        top_line = [Segment("".join(top[:lw]), axis)]
        x = lw
        while x < width:
            style = top_styles.get(x, axis)
            end = x + 1
            while end < width and top_styles.get(end, axis) is style:
                end += 1
            top_line.append(Segment("".join(top[x:end]), style))
            x = end
        bottom_line = [Segment("".join(bottom), axis)]
        if 0 <= now_col < columns:
            x = lw + now_col * cw
            # The marker wins over an hour label it lands on: blank that whole label.
            if bottom[x] != " ":
                left, right = x, x
                while left > lw and bottom[left - 1] != " ":
                    left -= 1
                while right + 1 < grid_end and bottom[right + 1] != " ":
                    right += 1
                bottom[left:right + 1] = " " * (right + 1 - left)
            bottom_line = [Segment("".join(bottom[:x]), axis), Segment("▼", now_style), Segment("".join(bottom[x + 1:]), axis)]
        return [Strip(top_line, width).crop(0, width), Strip(bottom_line, width).crop(0, width)]

    def _build_rules(self, n: int) -> Strip:
        """A pool's rules row: the pool's name, then the classes it takes in each stretch of time. A "▏"
        marks where a window opens or closes; the names shorten (finetune, ft, f) to fit their stretch."""
        width, cw, lw = self.size.width, self.cell_width, self.label_width
        pool = self.pools[self.pool_rows[n]]
        allowed = self._allowed[n] if n < len(self._allowed) else []
        columns = len(allowed)
        base = self.rich_style
        rule, past = base + self._style("rule"), base + self._style("past")
        shade = self._style(POOL_SHADES[n % 2])
        chars: list[str] = [" "] * (columns * cw)
        now_col = self._column_of(self.now)
        first = min(max(now_col, 0), columns)  # the past is blank and dimmed, as on the card rows
        styles: list[Style] = [past] * (first * cw) + [rule] * ((columns - first) * cw)
        if 0 <= now_col < columns:
            chars[now_col * cw], styles[now_col * cw] = "│", rule + self._overlay("now")
        column = first
        while column < columns:
            end = column + 1
            while end < columns and allowed[end] == allowed[column]:
                end += 1
            x = column * cw
            if column > 0 and column != now_col:  # a window opens or closes here
                chars[x], styles[x] = "▏", rule + self._style("rule-edge")
            if column > 0 or column == now_col:  # after the mark, or after the now line
                x += 1
            for text, style in self._rule_words(pool, allowed[column], end * cw - x):
                for ch in text:
                    chars[x], styles[x] = ch, style
                    x += 1
            column = end
        name = set_cell_size(abbreviate(inert(pool.name), lw - 1), lw - 1)
        segments = [Segment(name, base + self._style("label") + shade), Segment(" ", base)]
        x = 0
        while x < len(chars):
            end = x + 1
            while end < len(chars) and styles[end] is styles[x]:
                end += 1
            segments.append(Segment("".join(chars[x:end]), styles[x]))
            x = end
        used = lw + columns * cw
        if used < width:
            segments.append(Segment(" " * (width - used), base))
        return Strip(segments, width).crop(0, width)

    def _rule_words(self, pool: Pool, allowed: tuple[str, ...], room: int) -> list[tuple[str, Style]]:
        """The allowed classes in their colours, in the longest form that fits `room` cells."""
        base = self.rich_style
        rule = base + self._style("rule")
        cap = [(f" ≤{pool.max_hours:g}h", rule)] if pool.max_hours is not None else []
        if not allowed:
            forms = [[("closed", rule)]]
        elif set(allowed) == set(CLASSES):
            forms = [[("any class", rule), *cap], [("any", rule), *cap], [("any", rule)]]
        else:
            forms = []
            for short, gap in ((False, " "), (True, " "), (True, "")):
                words: list[tuple[str, Style]] = []
                for k in allowed:
                    if words and gap:
                        words.append((gap, rule))
                    words.append(((SHORT_CLASS[k] if gap else k[0]) if short else k, base + self._style(f"rule-{k}")))
                forms += [[*words, *cap], words]
        for words in forms:
            if sum(len(text) for text, _ in words) <= room:
                return words
        return []

    # -- cursor and selection ------------------------------------------------------------------

    def booking_at(self, row: int, column: int) -> Booking | None:
        if 0 <= row < len(self._grid) and 0 <= column < len(self._grid[row]):
            return self._grid[row][column]
        return None

    def _cursor_moved(self) -> None:
        row, column = self.cursor
        card = self.rows[row] if 0 <= row < len(self.rows) else None
        start = self.column_time(column)
        self.post_message(self.CursorMoved(self.booking_at(row, column), card, start, start + self.zoom.step))

    def _set_cursor(self, row: int, column: int, extend: bool) -> None:
        if not self.rows:
            return
        row = min(max(row, 0), len(self.rows) - 1)
        old_rows = self._selected_rows()
        if column < 0 or column >= self.zoom.columns:
            shift = column if column < 0 else column - self.zoom.columns + 1
            self._scroll_time(shift * self.zoom.step)
            column -= shift
            if self.anchor is not None:
                self.anchor = (self.anchor[0], self.anchor[1] - shift)
        if extend and self.anchor is None:
            self.anchor = self.cursor
        elif not extend and not self.marking:
            self.anchor = None
        self.cursor = (row, column)
        if row < self.row_offset:
            self.row_offset = row
            self._lines.clear()
        elif self.visible_rows and row >= self.row_offset + self.visible_rows:
            self.row_offset = row - self.visible_rows + 1
            self._lines.clear()
        self._refresh_rows(*(old_rows | self._selected_rows()))
        self._cursor_moved()

    def _selected_rows(self) -> set[int]:
        selection = self._selection()
        rows = {self.cursor[0]}
        if selection:
            rows |= set(range(selection[0], selection[1] + 1))
        return rows

    def _scroll_time(self, seconds: int) -> None:
        self.view_start += seconds
        self._rebuild_grid()
        self.post_message(self.ViewChanged(self.view_start, self.view_end))

    def action_move(self, rows: int, columns: int) -> None:
        self._set_cursor(self.cursor[0] + rows, self.cursor[1] + columns, extend=False)

    def action_extend(self, rows: int, columns: int) -> None:
        self._set_cursor(self.cursor[0] + rows, self.cursor[1] + columns, extend=True)

    def action_mark(self) -> None:
        """Space starts a selection at the cursor that the arrow keys then grow; space again ends it."""
        self.marking = not self.marking
        if self.marking:
            self.anchor = self.cursor
        self._refresh_rows(*self._selected_rows())

    def action_clear_selection(self) -> None:
        rows = self._selected_rows()
        self.anchor, self.marking = None, False
        self._refresh_rows(*rows)

    def shift_days(self, days: int) -> None:
        self._scroll_time(days * DAY)
        self._cursor_moved()

    def jump_to_now(self) -> None:
        self.view_start = align(self.now, self.zoom.step) - self.zoom.before
        self.anchor, self.marking = None, False
        self.cursor = (self.cursor[0], self._column_of(self.now))
        self._rebuild_grid()
        self.post_message(self.ViewChanged(self.view_start, self.view_end))
        self._cursor_moved()

    def cycle_zoom(self) -> None:
        self.set_zoom((self.zoom_index + 1) % len(ZOOMS))

    def set_zoom(self, index: int) -> None:
        focus = self.column_time(self.cursor[1])
        self.zoom_index = index
        self.view_start = align(self.now, self.zoom.step) - self.zoom.before
        if not self.view_start <= focus < self.view_end:
            self.view_start = align(focus, self.zoom.step) - self.zoom.columns // 4 * self.zoom.step
        self.anchor, self.marking = None, False
        self.cursor = (self.cursor[0], self._column_of(focus))
        self._rebuild_grid()
        self.post_message(self.ViewChanged(self.view_start, self.view_end))
        self._cursor_moved()

    def selected_range(self) -> tuple[list[int], int, int] | None:
        """(card indexes, start, end) of the selection, or of the cursor cell when nothing is selected."""
        if not self.rows:
            return None
        selection = self._selection() or (self.cursor[0], self.cursor[0], self.cursor[1], self.cursor[1])
        r0, r1, c0, c1 = selection
        cards = [self.rows[r].index for r in range(r0, r1 + 1)]
        return cards, self.column_time(c0), self.column_time(c1 + 1)

    def on_focus(self) -> None:
        self._refresh_rows(self.cursor[0])

    def on_blur(self) -> None:
        self._refresh_rows(self.cursor[0])

    # -- mouse ---------------------------------------------------------------------------------

    def _cell_at(self, x: int, y: int) -> tuple[int, int] | None:
        if y < self.axis_rows or x < self.label_width:
            return None
        row = y - self.axis_rows + self.row_offset
        column = (x - self.label_width) // self.cell_width
        if row >= len(self.rows) or column >= self.zoom.columns:
            return None
        return row, column

    def on_mouse_down(self, event: events.MouseDown) -> None:
        cell = self._cell_at(event.x, event.y)
        if cell is None:
            return
        self.focus()
        self.marking = False
        self.anchor = None
        self._set_cursor(*cell, extend=False)
        self.anchor = cell
        self.capture_mouse()
        event.stop()

    def on_mouse_move(self, event: events.MouseMove) -> None:
        if self.app.mouse_captured is self and event.button:
            cell = self._cell_at(max(event.x, self.label_width), max(event.y, self.axis_rows))
            if cell is not None and cell != self.cursor:
                self._set_cursor(*cell, extend=True)

    def on_mouse_up(self, event: events.MouseUp) -> None:
        if self.app.mouse_captured is self:
            self.capture_mouse(False)
            if self.anchor == self.cursor:
                self.anchor = None

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self._scroll_rows(1)
        event.stop()

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self._scroll_rows(-1)
        event.stop()

    def _scroll_rows(self, delta: int) -> None:
        most = max(0, len(self.rows) - self.visible_rows)
        offset = min(max(self.row_offset + delta, 0), most)
        if offset != self.row_offset:
            self.row_offset = offset
            self._lines.clear()
            self.refresh()

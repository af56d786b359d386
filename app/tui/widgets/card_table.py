"""The live card table: one line per card, each a cached Strip, rebuilt only when its card's cells change.

What each cell says, and which columns fit, is the model's (app.tui.card_table_model). This widget draws it
line by line (the Line API, as the timeline): a poll diffs the cells, rebuilds the lines of the cards whose
cells changed and refreshes only those lines. It looks and behaves as the DataTable it replaces did (a row
cursor, enter or a click on the highlighted row selects, the header fixed above the rows).

Where the board knows more than one host, each host's cards follow a heading line with its name (one host: no
headings, today's table); the cursor moves over cards only.
"""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size, Spacing
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from app.core.cardstate import CardStatus
from app.core.text import inert
from app.tui.card_table_model import WIDE_MIN_WIDTH, cell_parts, host_groups, table_columns, wants_requests
from app.tui.node import BoardNode

PADDING = 1  # blank cells either side of each column, as DataTable's cell_padding


class Cell:
    """A one-line cell as ready-made segments, built once per change of what it shows."""

    __slots__ = ("segments", "length", "justify", "plain")

    def __init__(self, parts: Sequence[tuple[str, Style | None]], justify: str = "left") -> None:
        self.segments = [Segment(text, style) for text, style in parts if text]
        self.plain = "".join(text for text, _ in parts)
        self.length = sum(cell_len(text) for text, _ in parts)
        self.justify = justify

    def __str__(self) -> str:
        return self.plain

    def fit(self, width: int) -> list[Segment]:
        """Exactly `width` cells: padded to its justification, or cut with an ellipsis."""
        if self.length <= width:
            if self.length == width:
                return list(self.segments)
            pad = Segment(" " * (width - self.length))
            return [pad, *self.segments] if self.justify == "right" else [*self.segments, pad]
        cropped = Segment.adjust_line_length(self.segments, max(0, width - 1))
        return [*cropped, Segment("…", cropped[-1].style if cropped else None)]


class CardTable(BoardNode, ScrollView, can_focus=True):
    """Columns differ between the compact (80 columns) and wide layouts; `show` picks by width."""

    DEFAULT_CSS = """
    CardTable {
        height: auto; max-height: 60%; background: $surface; color: $foreground;
        scrollbar-size-vertical: 1; overflow-x: hidden;
    }
    CardTable:focus { background-tint: $foreground 5%; }
    CardTable > .cards--header { color: $text-muted; text-style: bold; background: $surface; }
    CardTable:focus > .cards--header { background-tint: $foreground 5%; }
    CardTable > .cards--cursor {
        background: $block-cursor-blurred-background; color: $block-cursor-blurred-foreground;
        text-style: $block-cursor-blurred-text-style;
    }
    CardTable:focus > .cards--cursor {
        background: $block-cursor-background; color: $block-cursor-foreground; text-style: $block-cursor-text-style;
    }
    CardTable > .cards--hover { background: $block-hover-background; }
    CardTable > .cards--free { color: $success; text-style: bold; }
    CardTable > .cards--booked { color: $warning; text-style: bold; }
    CardTable > .cards--in-use { color: $primary; text-style: bold; }
    CardTable > .cards--squatted { color: $error; text-style: bold reverse; }
    CardTable > .cards--lost { color: $error; text-style: bold; }
    CardTable > .cards--warning { color: $error; text-style: bold; }
    CardTable > .cards--ok { color: $success; }
    CardTable > .cards--warn { color: $warning; }
    CardTable > .cards--danger { color: $error; text-style: bold; }
    CardTable > .cards--na { color: $text-muted; }
    CardTable > .cards--muted { color: $text-muted; }
    CardTable > .cards--mine { color: $accent; text-style: bold; }
    """
    COMPONENT_CLASSES = {
        "cards--header", "cards--cursor", "cards--hover",
        "cards--free", "cards--booked", "cards--in-use", "cards--squatted", "cards--lost", "cards--warning",
        "cards--ok", "cards--warn", "cards--danger", "cards--na", "cards--muted", "cards--mine",
    }
    BINDINGS = [
        Binding("enter", "select_cursor", "Select", show=False),
        Binding("up", "cursor(-1)", "Cursor up", show=False),
        Binding("down", "cursor(1)", "Cursor down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("ctrl+home", "first", "Top", show=False),
        Binding("ctrl+end", "last", "Bottom", show=False),
        Binding("left,right,home,end", "nothing", show=False),  # DataTable's scroll sideways: nothing hidden here
    ]

    header_height = 1
    cursor_row: reactive[int] = reactive(0, always_update=False, repaint=False)

    class RowHighlighted(Message):
        """The cursor moved onto the card `uuid` (row `cursor_row`)."""

        def __init__(self, table: CardTable, cursor_row: int, uuid: str) -> None:
            super().__init__()
            self.table, self.cursor_row, self.uuid = table, cursor_row, uuid

        @property
        def control(self) -> CardTable:
            return self.table

    class RowSelected(RowHighlighted):
        """Enter, or a click on the highlighted row: the card `uuid` is chosen."""

    def __init__(self, me: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.me = me
        self._layout: tuple | None = None
        self._columns: list[tuple[str, str, int]] = []  # (key, title, width) in display order
        self._rows: list[str] = []  # UUIDs in display order
        self._display: list[int | str] = []  # each line below the header: a row of _rows, or a host's heading
        self._line_of: list[int] = []  # each row's line in _display
        self._cells: list[list[Cell]] = []  # per row, per column
        self._built: dict[tuple[str, str], tuple] = {}  # (uuid, column) -> (parts, Cell, shown values)
        self._lines: dict[int, Strip] = {}  # row (-1: the header) -> its line, built lazily
        self._row_styles: dict[tuple, tuple] = {}  # (row, hover, cursor) -> _styles_for's
        self._hover: int | None = None  # the row under the mouse
        self.statuses: tuple[CardStatus, ...] = ()
        self._requested = False  # the wide VRAM column has room for requests

    # -- what tests and screens read ----------------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self._rows)

    @property
    def column_keys(self) -> list[str]:
        return [key for key, _, _ in self._columns]

    def get_row_at(self, row: int) -> list[Cell]:
        return list(self._cells[row])

    def status_at_cursor(self) -> CardStatus | None:
        if 0 <= self.cursor_row < len(self.statuses):
            return self.statuses[self.cursor_row]
        return None

    # -- data ----------------------------------------------------------------------------------

    def show(self, statuses: Sequence[CardStatus], now: float) -> None:
        """Diff the table against new statuses: only the lines of cards whose cells changed are rebuilt."""
        self.statuses = tuple(statuses)
        width = self.size.width or self.app.size.width
        wide = self.app.size.width >= WIDE_MIN_WIDTH
        mixed = len({s.reading.name for s in statuses}) > 1
        requested = wants_requests(statuses, wide)
        self._requested = requested
        layout = (wide, mixed, width if wide else 0, any(s.label for s in statuses), requested)
        uuids = [s.reading.uuid for s in statuses]
        display: list[int | str] = list(range(len(statuses)))
        if (hosts := host_groups(statuses)) is not None:
            display = []
            for host in hosts:  # its heading, then its cards
                display += [host, *(n for n, s in enumerate(statuses) if s.host == host)]
        if layout != self._layout:
            self._columns = table_columns(statuses, wide, width, requested)
            self._layout, self._rows, self._row_styles = layout, [], {}
        keys = self.column_keys
        rows = [[cells[c] for c in keys] for cells in (self._cells_for(s, now, wide) for s in statuses)]
        if uuids != self._rows or display != self._display:  # new cards, or another order: every line anew
            self._rows, self._cells, self._lines = uuids, rows, {}
            self._display = display
            self._line_of = [0] * len(rows)
            for line, item in enumerate(display):
                if isinstance(item, int):
                    self._line_of[item] = line
            self.virtual_size = Size(sum(w + 2 * PADDING for _, _, w in self._columns), 1 + len(display))
            self.cursor_row = min(self.cursor_row, max(0, len(rows) - 1))
            self.refresh()
            return
        for index, (old, new) in enumerate(zip(self._cells, rows)):
            if any(a is not b for a, b in zip(old, new)):
                self._cells[index] = new
                self._refresh_row(index)

    def _cells_for(self, s: CardStatus, now: float, wide: bool) -> dict[str, Cell]:
        """Every cell of a row; the model (cell_parts) does the formatting, this only builds what changed.

        Power and utilisation move every second by what nobody reads: their cells change only once they have
        moved by STEPS from what they show, or their colour changes."""
        cells = {}
        r = s.reading
        values = {"power": (r.power_w, r.power_limit_w), "util": (r.utilization_pct, None)}
        for column, spec in cell_parts(s, now, me=self.me, wide=wide, with_requests=self._requested).items():
            cached = self._built.get((r.uuid, column))
            if cached is None or cached[0] != spec:
                if column in STEPS and cached is not None and _near(cached[2], values[column], STEPS[column]) \
                        and cached[0][0][0][1] == spec[0][0][1]:
                    cells[column] = cached[1]
                    continue
                parts, justify = spec
                cell = Cell([(plain, self._style(style) if style else None) for plain, style in parts], justify)
                cached = self._built[(r.uuid, column)] = (spec, cell, values.get(column))
            cells[column] = cached[1]
        return cells

    # -- lines ---------------------------------------------------------------------------------

    def _style(self, name: str) -> Style:
        """Component styles, resolved once per theme and focus rather than for every cell of every poll."""
        cache = self.__dict__.setdefault("_style_cache", {})
        style = cache.get(name)
        if style is None:
            style = cache[name] = self.get_component_styles(name).rich_style
        return style

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.__dict__.pop("_style_cache", None)
        self._built, self._lines, self._row_styles = {}, {}, {}
        self._layout = None
        if self.statuses:  # a theme or focus change: rebuild with its colours now, not at the next poll
            self.call_after_refresh(lambda: self.show(self.statuses, self.app.clock()))

    def _refresh_row(self, row: int | None) -> None:
        """Forget the row's line and repaint only that line, if it is on screen."""
        if row is None or row >= len(self._line_of):
            return
        self._lines.pop(row, None)
        y = 1 + self._line_of[row] - int(self.scroll_y)
        if 1 <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def on_resize(self, event: events.Resize) -> None:
        self._lines = {}

    def watch_scroll_x(self, old: float, new: float) -> None:
        self._lines = {}
        super().watch_scroll_x(old, new)

    def render_line(self, y: int) -> Strip:
        row = -1
        if y >= self.header_height:
            at = y - self.header_height + int(self.scroll_y)
            if at >= len(self._display):
                return Strip.blank(self.size.width, self.rich_style)
            shown = self._display[at]
            if isinstance(shown, str):
                return self._heading(shown)
            row = shown
        line = self._lines.get(row)
        if line is None:
            line = self._lines[row] = self._build_line(row)
        return line

    def _build_line(self, row: int) -> Strip:
        """One row as DataTable drew it: each cell padded and styled (the row's style, the cursor's over it),
        the rest of the width in the row's style, cut to the widget."""
        header = row == -1
        state = (row, not header and row == self._hover, not header and row == self.cursor_row)
        styles = self._row_styles.get(state)
        if styles is None:  # the same for every build of the row until the theme, focus, cursor or hover change
            styles = self._row_styles[state] = self._styles_for(*state)
        base, pres, post, extend = styles
        pad = Segment(" " * PADDING)
        segments: list[Segment] = []
        cells = [Cell(((title, None),)) for _, title, _ in self._columns] if header else self._cells[row]
        widths = [width for _, _, width in self._columns]
        column = 0
        while column < len(cells):
            cell, width, pre = cells[column], widths[column], pres[column]
            column += 1
            # A cell too long for its column spills into the blank ones after it (a down host's HOST DOWN).
            while cell.length > width and column < len(cells) and cells[column].length == 0:
                width += widths[column] + 2 * PADDING
                column += 1
            segments += Segment.apply_style([pad, *cell.fit(width), pad], pre, post)
        segments.append(Segment(" " * max(0, self.size.width - self.virtual_size.width), extend))
        x = int(self.scroll_x)
        strip = Strip(segments).crop(x, x + self.size.width) if x else Strip(segments)
        return strip.adjust_cell_length(self.size.width, base).simplify()

    def _heading(self, host: str) -> Strip:
        """A host's heading line: its name, above its cards."""
        style = self.rich_style + self._style("cards--header")
        return Strip([Segment(f" {inert(host, 60)}", style)]).adjust_cell_length(self.size.width, style)

    def _styles_for(self, row: int, hover: bool, cursor: bool) -> tuple:
        """The widget's style, each cell's style before its own and after (the cursor's colour over a cell's; a
        cell's background stays, as in DataTable), and the style of the rest of the line. The row and column go
        in as meta, as DataTable's."""
        base = self.rich_style
        component = Style()
        if hover:
            component += self._style("cards--hover")
        if cursor:
            component += self._style("cards--cursor")
        row_style = self._style("cards--header") if row == -1 else base
        pres = [row_style + Style.from_meta({"row": row, "column": column}) + component
                for column in range(len(self._columns))]
        extend = row_style + component + Style.from_meta({"row": row, "column": 0, "out_of_bounds": True})
        return base, pres, Style.from_color(component.color), extend

    # -- the cursor ----------------------------------------------------------------------------

    def validate_cursor_row(self, row: int) -> int:
        return max(0, min(row, len(self._rows) - 1))

    def watch_cursor_row(self, old: int, new: int) -> None:
        self._refresh_row(old)
        self._refresh_row(new)
        if self._rows:
            line = self._line_of[new]
            above = 2 if line and isinstance(self._display[line - 1], str) else 1  # the header; and a host's heading
            self.scroll_to_region(Region(0, 1 + line, 1, 1), spacing=Spacing(above, 0, 0, 0), force=True)
            self.post_message(self.RowHighlighted(self, new, self._rows[new]))

    def move_cursor(self, *, row: int) -> None:
        self.cursor_row = row

    def _keyboard(self) -> None:
        """Keys hide the mouse's hover, as DataTable's do."""
        hover, self._hover = self._hover, None
        self._refresh_row(hover)

    def action_cursor(self, rows: int) -> None:
        self._keyboard()
        self.cursor_row += rows

    def action_page(self, pages: int) -> None:
        self._keyboard()
        self.cursor_row += pages * max(1, self.scrollable_content_region.height - self.header_height)

    def action_first(self) -> None:
        self._keyboard()
        self.cursor_row = 0

    def action_last(self) -> None:
        self._keyboard()
        self.cursor_row = len(self._rows) - 1

    def action_nothing(self) -> None:
        pass

    def action_select_cursor(self) -> None:
        self._keyboard()
        if self._rows:
            self.post_message(self.RowSelected(self, self.cursor_row, self._rows[self.cursor_row]))

    def _row_under(self, event: events.MouseEvent) -> int | None:
        at = event.y - self.header_height + int(self.scroll_y)
        row = self._display[at] if event.y >= self.header_height and 0 <= at < len(self._display) else None
        return row if isinstance(row, int) else None

    def on_mouse_move(self, event: events.MouseMove) -> None:
        hover, self._hover = self._hover, self._row_under(event)
        if hover != self._hover:
            self._refresh_row(hover)
            self._refresh_row(self._hover)

    def on_leave(self, event: events.Leave) -> None:
        self._keyboard()

    def on_click(self, event: events.Click) -> None:
        row = self._row_under(event)
        if row is None:
            return
        event.stop()
        if row == self.cursor_row:
            self.action_select_cursor()
        self.cursor_row = row

    def on_focus(self) -> None:
        self._lines, self._row_styles = {}, {}

    def on_blur(self) -> None:
        self._lines, self._row_styles = {}, {}


STEPS = {"power": 5.0, "util": 5}  # watts; percentage points


def _near(shown: tuple, now: tuple, step: float) -> bool:
    """Whether (value, limit) `now` is within `step` of the one a cell shows, at the same limit."""
    return (shown[0] is not None and now[0] is not None and shown[1] == now[1]
            and abs(now[0] - shown[0]) < step)

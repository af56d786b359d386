"""The timeline calendar: cards down, time across, bookings as coloured blocks.

The pools' rules are drawn too, so nobody learns them by being refused: each pool's cards are shaded
alike, and under the time axis one row per pool says which classes it takes in each stretch of time,
with a mark where a class window opens or closes. A project's allocation ([[projects]]) is drawn the same way:
its cards' free cells shaded over its hours, and one row per project saying which cards it holds when.

What is where is the model's (app.tui.timeline_model: the grid, the zoom, the cursor, the selection);
this widget draws it and turns keys and clicks into calls on it. Built for thousands of bookings: each
visible line is a precomputed `Strip` of run-length segments, so a repaint is a list lookup. Cursor
moves rebuild only the lines they touch.
"""

from __future__ import annotations

from datetime import date, tzinfo
from typing import Callable, Sequence, TypeVar

from rich.cells import set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from app.config import CLASSES, Config, Pool
from app.core.text import inert
from app.gpu.model import CardReading
from app.model import Booking
from app.tui.render import abbreviate, local
from app.tui.timeline_model import DAY, ZOOMS, Moved, Row, TimelineModel, held_words, rule_words

AXIS_ROWS = 2
POOL_SHADES = ("pool-a", "pool-b")  # alternate, so neighbouring pools part
HELD_SHADES = ("held-a", "held-b")  # a project's allocation, apart from the pools' shades and each other's
V = TypeVar("V")


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
    Timeline > .timeline--held-a { background: $success 16%; }
    Timeline > .timeline--held-b { background: $error 14%; }
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
        "timeline--rule-finetune", "timeline--rule-experiment", "timeline--held-a", "timeline--held-b",
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
                 projects: Config | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.model = TimelineModel(me, now, pools=pools, zone=zone, projects=projects)
        self._lines: dict[int, Strip] = {}  # card row -> strip, built lazily
        self._axis: list[Strip] | None = None
        self._styles: dict[str, Style] = {}
        self._width = 0

    # -- geometry in cells -----------------------------------------------------------------------

    @property
    def cell_width(self) -> int:
        return max(1, (self.size.width - self.model.label_width) // self.model.zoom.columns)

    @property
    def axis_rows(self) -> int:
        """The time axis, the pools' rules rows and the projects' rows above the cards."""
        return AXIS_ROWS + len(self.model.pool_rows) + len(self.model.project_rows)

    @property
    def visible_rows(self) -> int:
        return max(0, self.size.height - self.axis_rows)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.axis_rows + max(1, len(self.model.rows))

    # -- data ----------------------------------------------------------------------------------

    def set_cards(self, cards: Sequence[CardReading], labels: dict[int, str] | None = None, wide: bool = False,
                  hosts: Sequence[str | None] = (), here: str = "") -> None:
        if self.model.set_cards(cards, labels, wide, hosts, here):
            self._invalidate()
            self.refresh(layout=True)

    def set_bookings(self, bookings: Sequence[Booking]) -> None:
        self.model.set_bookings(bookings)
        self._invalidate()
        self._cursor_moved()

    def set_now(self, now: float) -> None:
        if self.model.set_now(now):
            self._invalidate()

    # -- painting ------------------------------------------------------------------------------

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

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if width != self._width:
            self._width = width
            self._lines.clear()
            self._axis = None
        if y < self.axis_rows:
            if self._axis is None:
                self._axis = [*self._build_axis(), *(self._build_rules(n) for n in range(len(self.model.pool_rows))),
                              *(self._build_holds(n) for n in range(len(self.model.project_rows)))]
            return self._axis[y]
        row = y - self.axis_rows + self.model.row_offset
        if row >= len(self.model.rows):
            return Strip.blank(width, self.rich_style)
        line = self._lines.get(row)
        if line is None:
            line = self._lines[row] = self._build_row(row)
        return line

    def _build_row(self, row: int) -> Strip:
        model = self.model
        width, cw, lw = self.size.width, self.cell_width, model.label_width
        card = model.rows[row]
        cells = model.grid[row]
        now_col = model.column_of(model.now)
        selection = model.selection()  # (first row, last row, first column, last column)
        # The selection's columns, where it covers this row.
        selected_span = selection[2:] if selection is not None and selection[0] <= row <= selection[1] else None
        cursor_col = model.cursor[1] if model.cursor[0] == row and self.has_focus else -1
        base = self.rich_style
        pool = model.row_pool[row] if row < len(model.row_pool) else None
        shade = self._style(POOL_SHADES[model.pool_rows.index(pool) % 2]) if pool is not None else Style()
        held = model.held[row] if row < len(model.held) else [None] * len(cells)
        label_style = base + self._style("label-lost" if card.lost else "label") + shade
        segments = [Segment(set_cell_size(card.label, lw - 1), label_style), Segment(" ", base)]
        free, past, now_style = self._style("free") + shade, self._style("past"), self._overlay("now")
        mine, selected, cursor = self._overlay("mine"), self._style("selection"), self._style("cursor")
        columns = len(cells)

        def overlay(c: int) -> int:  # 0 none, 1 the now column, 2 selected, 3 the cursor
            if c == cursor_col:
                return 3
            if selected_span is not None and selected_span[0] <= c <= selected_span[1]:
                return 2
            return 1 if c == now_col else 0

        column = 0
        block_start, block_text = 0, ""
        while column < columns:
            owner, kind, is_past, window = cells[column], overlay(column), column < now_col, held[column]
            end = column + 1
            # A run: the same owner (by identity), overlay, past/future and allocation window on every column of it.
            while (end < columns and cells[end] is owner and overlay(end) == kind and (end < now_col) == is_past
                   and held[end] is window):
                end += 1
            span = (end - column) * cw
            if owner is None:
                style = base + (past if is_past else free)
                if window is not None and not is_past:  # a project's allocation: its hours, shaded as its row
                    style += self._style(HELD_SHADES[model.project_rows.index(window.project) % 2])
                text = ("·" + " " * (cw - 1)) * (end - column)
            else:
                style = base + self._style(owner.klass if owner.klass in CLASSES else "experiment")
                if owner.user == model.me:
                    style += mine
                if column == 0 or cells[column - 1] is not owner:  # a block starts: its label spans its runs
                    block_start = column
                    label = model.block_label(owner, row, column)
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
        model = self.model
        width, cw, lw = self.size.width, self.cell_width, model.label_width
        step, columns = model.zoom.step, model.zoom.columns
        base = self.rich_style
        axis, day_style, now_style = base + self._style("axis"), base + self._style("day"), base + self._style("now")
        top = [" "] * width
        bottom = [" "] * width
        top_styles: dict[int, Style] = {}
        # Day labels where the local date changes, and at the left edge if it fits before the next one.
        starts: list[tuple[int, date]] = []
        previous = None
        for c in range(columns):
            day = local(model.column_time(c)).date()
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
            t = model.column_time(c)
            moment = local(t)
            if (moment.hour * 3600 + moment.minute * 60) % seconds == 0:
                x = lw + c * cw
                text = moment.strftime(fmt)
                if x + len(text) <= grid_end:
                    bottom[x:x + len(text)] = text
        now_col = model.column_of(model.now)
        zoom = f"  zoom {model.zoom.name}"
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
        model = self.model
        pool = model.pools[model.pool_rows[n]]
        allowed = model.allowed[n] if n < len(model.allowed) else []
        return self._build_band(pool.name, self._style(POOL_SHADES[n % 2]), allowed,
                                lambda classes, room: self._rule_words(pool, classes, room))

    def _build_holds(self, n: int) -> Strip:
        """A project's row: its name, then over its allocation's hours the cards it holds ('holds cards 0-3'),
        shaded as those cards' cells are."""
        model = self.model
        shade = self._style(HELD_SHADES[n % 2])
        held = self.rich_style + self._style("rule") + shade

        def words(cards: tuple[int, ...], room: int) -> list[tuple[str, Style]]:
            return [(held_words(cards, room), held)]

        return self._build_band(model.project_rows[n], shade, model.holding[n] if n < len(model.holding) else [],
                                words, lambda cards: held if cards else None)

    def _build_band(self, name: str, shade: Style, values: Sequence[V],
                    words: Callable[[V, int], list[tuple[str, Style]]],
                    fill: Callable[[V], Style | None] = lambda value: None) -> Strip:
        """A row above the cards: `name` (inert) in the label column, shaded `shade`, then per stretch of columns
        with equal values (from now on) the words for it, after a "▏" where the value changes; `fill` styles a
        whole stretch (None: as the row)."""
        model = self.model
        width, cw, lw = self.size.width, self.cell_width, model.label_width
        columns = len(values)
        base = self.rich_style
        rule, past = base + self._style("rule"), base + self._style("past")
        chars: list[str] = [" "] * (columns * cw)
        now_col = model.column_of(model.now)
        first = min(max(now_col, 0), columns)  # the past is blank and dimmed, as on the card rows
        styles: list[Style] = [past] * (first * cw) + [rule] * ((columns - first) * cw)
        stretches: list[tuple[int, int, Style]] = []
        column = first
        while column < columns:
            end = column + 1
            while end < columns and values[end] == values[column]:
                end += 1
            style = fill(values[column]) or rule
            styles[column * cw:end * cw] = [style] * ((end - column) * cw)
            stretches.append((column, end, style))
            column = end
        if 0 <= now_col < columns:
            chars[now_col * cw], styles[now_col * cw] = "│", styles[now_col * cw] + self._overlay("now")
        for column, end, style in stretches:
            x = column * cw
            if column > 0 and column != now_col:  # a window opens or closes here
                chars[x], styles[x] = "▏", style + self._style("rule-edge")
            if column > 0 or column == now_col:  # after the mark, or after the now line
                x += 1
            for text, piece in words(values[column], end * cw - x):
                for ch in text:
                    chars[x], styles[x] = ch, piece
                    x += 1
        label = set_cell_size(abbreviate(inert(name), lw - 1), lw - 1)
        segments = [Segment(label, base + self._style("label") + shade), Segment(" ", base)]
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
        """The model's words for these classes (app.tui.timeline_model.rule_words) in their colours."""
        base = self.rich_style
        rule = base + self._style("rule")
        return [(text, rule if style == "rule" else base + self._style(style))
                for text, style in rule_words(pool, allowed, room)]

    # -- cursor and selection ------------------------------------------------------------------

    def _cursor_moved(self) -> None:
        self.post_message(self.CursorMoved(*self.model.cursor_cell()))

    def _view_changed(self) -> None:
        self.post_message(self.ViewChanged(self.model.view_start, self.model.view_end))

    def _moved(self, moved: Moved | None) -> None:
        """Repaint what a cursor move changed, and say so."""
        if moved is None:
            return
        if moved.view:
            self._invalidate()
            self._view_changed()
        if moved.scrolled:
            self._lines.clear()
        self._refresh_rows(*moved.rows)
        self._cursor_moved()

    def action_move(self, rows: int, columns: int) -> None:
        cursor = self.model.cursor
        self._moved(self.model.move_cursor(cursor[0] + rows, cursor[1] + columns, extend=False,
                                           visible_rows=self.visible_rows))

    def action_extend(self, rows: int, columns: int) -> None:
        cursor = self.model.cursor
        self._moved(self.model.move_cursor(cursor[0] + rows, cursor[1] + columns, extend=True,
                                           visible_rows=self.visible_rows))

    def action_mark(self) -> None:
        """Space starts a selection at the cursor that the arrow keys then grow; space again ends it."""
        self._refresh_rows(*self.model.mark())

    def action_clear_selection(self) -> None:
        self._refresh_rows(*self.model.clear_selection())

    def shift_days(self, days: int) -> None:
        self.model.scroll_time(days * DAY)
        self._invalidate()
        self._view_changed()
        self._cursor_moved()

    def jump_to_now(self) -> None:
        self.model.jump_to_now()
        self._invalidate()
        self._view_changed()
        self._cursor_moved()

    def cycle_zoom(self) -> None:
        self.set_zoom((self.model.zoom_index + 1) % len(ZOOMS))

    def set_zoom(self, index: int) -> None:
        self.model.set_zoom(index)
        self._invalidate()
        self._view_changed()
        self._cursor_moved()

    def on_focus(self) -> None:
        self._refresh_rows(self.model.cursor[0])

    def on_blur(self) -> None:
        self._refresh_rows(self.model.cursor[0])

    # -- mouse ---------------------------------------------------------------------------------

    def _cell_at(self, x: int, y: int) -> tuple[int, int] | None:
        if y < self.axis_rows or x < self.model.label_width:
            return None
        row = y - self.axis_rows + self.model.row_offset
        column = (x - self.model.label_width) // self.cell_width
        if row >= len(self.model.rows) or column >= self.model.zoom.columns:
            return None
        return row, column

    def on_mouse_down(self, event: events.MouseDown) -> None:
        cell = self._cell_at(event.x, event.y)
        if cell is None:
            return
        self.focus()
        self._moved(self.model.press(*cell, visible_rows=self.visible_rows))
        self.capture_mouse()
        event.stop()

    def on_mouse_move(self, event: events.MouseMove) -> None:
        if self.app.mouse_captured is self and event.button:
            cell = self._cell_at(max(event.x, self.model.label_width), max(event.y, self.axis_rows))
            if cell is not None and cell != self.model.cursor:
                self._moved(self.model.move_cursor(*cell, extend=True, visible_rows=self.visible_rows))

    def on_mouse_up(self, event: events.MouseUp) -> None:
        if self.app.mouse_captured is self:
            self.capture_mouse(False)
            self.model.release()

    def on_mouse_scroll_down(self, event: events.MouseScrollDown) -> None:
        self._scroll_rows(1)
        event.stop()

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self._scroll_rows(-1)
        event.stop()

    def _scroll_rows(self, delta: int) -> None:
        if self.model.scroll_rows(delta, self.visible_rows):
            self._lines.clear()
            self.refresh()

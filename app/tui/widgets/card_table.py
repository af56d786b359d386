"""The live card table: one row per card, keyed by its UUID, diffed cell by cell on every poll.

What each cell says, and which columns fit, is the model's (app.tui.card_table_model); this widget draws
it and touches only the cells that changed.
"""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from app.core.cardstate import CardStatus
from app.tui.card_table_model import WIDE_MIN_WIDTH, cell_parts, table_columns, wants_requests

class Cell:
    """A one-line cell as ready-made segments: DataTable re-renders every cell of a changed row each
    poll, and this skips Text's wrapping and justification machinery (a third of the board's idle CPU)."""

    __slots__ = ("segments", "length", "justify", "plain")

    def __init__(self, parts: Sequence[tuple[str, Style | None]], justify: str = "left") -> None:
        self.segments = [Segment(text, style) for text, style in parts if text]
        self.plain = "".join(text for text, _ in parts)
        self.length = sum(cell_len(text) for text, _ in parts)
        self.justify = justify

    def __str__(self) -> str:
        return self.plain

    def __rich_measure__(self, console, options) -> Measurement:
        return Measurement(self.length, self.length)

    def __rich_console__(self, console, options):
        width = options.max_width
        if self.length <= width:
            pad = Segment(" " * (width - self.length))
            if self.justify == "right":
                yield pad
                yield from self.segments
            else:
                yield from self.segments
                yield pad
            return
        cropped = Segment.adjust_line_length(self.segments, max(0, width - 1))
        yield from cropped
        yield Segment("…", cropped[-1].style if cropped else None)


class CardTable(DataTable):
    """Columns differ between the compact (80 columns) and wide layouts; `show` picks by width."""

    DEFAULT_CSS = """
    CardTable { height: auto; max-height: 60%; }
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
    COMPONENT_CLASSES = DataTable.COMPONENT_CLASSES | {
        "cards--free", "cards--booked", "cards--in-use", "cards--squatted", "cards--lost", "cards--warning",
        "cards--ok", "cards--warn", "cards--danger", "cards--na", "cards--muted", "cards--mine",
    }

    def __init__(self, me: str, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False, show_cursor=True)
        self.me = me
        self._layout: tuple | None = None
        self._rows: list[str] = []  # UUIDs in display order
        self._cells: dict[tuple[str, str], Cell] = {}
        self._built: dict[tuple[str, str], tuple[tuple, Cell]] = {}  # (uuid, column) -> (parts, Cell)
        self._changed_rows: set = set()
        self._known_stores = all(hasattr(self, name) for name in _DATA_TABLE_STORES)
        self.statuses: tuple[CardStatus, ...] = ()
        self._requested = False  # the wide VRAM column has room for requests

    # -- repainting only what changed ------------------------------------------------------------

    def update_cell(self, row_key, column_key, value, *, update_width: bool = False) -> None:
        """DataTable.update_cell counts an update of the whole table: every cached cell, row and line is stale
        then, and it repaints all of them. A poll changes a few cells, so this puts the value in, and the repaint
        (_repaint_changed_rows) forgets only what showed those cells and redraws only their rows: the other rows'
        lines and the changed rows' other cells stay cached (bench/bench_tui.py)."""
        if update_width or not self._known_stores:  # another Textual's DataTable: its own way
            self._quiet = True
            try:
                super().update_cell(row_key, column_key, value, update_width=update_width)
            finally:
                self._quiet = False
        else:
            row_key = RowKey(row_key) if isinstance(row_key, str) else row_key
            column_key = ColumnKey(column_key) if isinstance(column_key, str) else column_key
            self._data[row_key][column_key] = value
        self._changed_rows.add((row_key, column_key))

    def _repaint_changed_rows(self) -> None:
        changed = {(RowKey(r) if isinstance(r, str) else r, ColumnKey(c) if isinstance(c, str) else c)
                   for r, c in self._changed_rows}
        rows = {row for row, _ in changed}
        self._changed_rows.clear()
        if not rows:
            return
        # Forget only what showed a changed cell: its row's renderables, the cell's renders, its row's, and the
        # lines of its row.
        indexes = {self.get_row_index(row) for row in rows}
        caches = [] if not self._known_stores else [(self._row_renderable_cache, lambda key: key[1] in indexes),
                  (self._cell_render_cache, lambda key: (key[0], key[1]) in changed),
                  (self._row_render_cache, lambda key: key[0] in rows),
                  (self._line_cache, lambda key: self._row_at(key[0]) in rows)]
        for cache, stale in caches:
            for key in [key for key in cache.keys() if stale(key)]:
                cache.discard(key)
        for index in indexes:
            self.refresh_row(index)

    def _row_at(self, y: int):
        try:
            return self._get_offsets(y)[0]
        except LookupError:
            return None  # the header

    def refresh(self, *regions, **kwargs):
        if getattr(self, "_quiet", False) and not regions and not kwargs:
            return self
        return super().refresh(*regions, **kwargs)

    # -- data ----------------------------------------------------------------------------------

    def show(self, statuses: Sequence[CardStatus], now: float) -> None:
        """Diff the table against new statuses: only changed cells are touched; rows keep their keys."""
        self.statuses = tuple(statuses)
        width = self.size.width or self.app.size.width
        wide = self.app.size.width >= WIDE_MIN_WIDTH
        mixed = len({s.reading.name for s in statuses}) > 1
        requested = wants_requests(statuses, wide)
        self._requested = requested
        layout = (wide, mixed, width if wide else 0, any(s.label for s in statuses), requested)
        uuids = [s.reading.uuid for s in statuses]
        with self.app.batch_update():
            if layout != self._layout:
                self.clear(columns=True)
                for key, label, w in table_columns(statuses, wide, width, requested):
                    self.add_column(label, key=key, width=w)
                self._layout, self._rows, self._cells = layout, [], {}
            columns = [c.key.value for c in self.ordered_columns]
            if uuids != self._rows:
                cursor = self.cursor_row
                self.clear()
                self._cells = {}
                for status in statuses:
                    cells = self._cells_for(status, now, wide)
                    self.add_row(*(cells[c] for c in columns), key=status.reading.uuid)
                    for c in columns:
                        self._cells[(status.reading.uuid, c)] = cells[c]
                self._rows = uuids
                if statuses:
                    self.move_cursor(row=min(cursor, len(statuses) - 1))
                return
            for status in statuses:
                uuid = status.reading.uuid
                cells = self._cells_for(status, now, wide)
                for c in columns:
                    if self._cells.get((uuid, c)) is not cells[c]:
                        self._cells[(uuid, c)] = cells[c]
                        self.update_cell(uuid, c, cells[c])
            self._repaint_changed_rows()

    def status_at_cursor(self) -> CardStatus | None:
        if 0 <= self.cursor_row < len(self.statuses):
            return self.statuses[self.cursor_row]
        return None

    # -- cells ---------------------------------------------------------------------------------

    def _style(self, name: str):
        """Component styles, resolved once per theme rather than for every cell of every poll."""
        cache = self.__dict__.setdefault("_style_cache", {})
        style = cache.get(name)
        if style is None:
            style = cache[name] = self.get_component_rich_style(name)
        return style

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.__dict__.pop("_style_cache", None)
        self._cells, self._built = {}, {}
        self._layout = None
        if self.statuses:  # a theme or focus change: rebuild with its colours now, not at the next poll
            self.call_after_refresh(lambda: self.show(self.statuses, self.app.clock()))

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


# DataTable's cell store and the caches of what it drew (Textual 1 to 8): the ones a changed cell makes stale.
# tests/tui/test_tui_behaviour.py (TestCardTable) checks that a changed cell is drawn anew and nothing else.
_DATA_TABLE_STORES = ("_data", "_row_renderable_cache", "_cell_render_cache", "_row_render_cache", "_line_cache")
STEPS = {"power": 5.0, "util": 5}  # watts; percentage points


def _near(shown: tuple, now: tuple, step: float) -> bool:
    """Whether (value, limit) `now` is within `step` of the one a cell shows, at the same limit."""
    return (shown[0] is not None and now[0] is not None and shown[1] == now[1]
            and abs(now[0] - shown[0]) < step)

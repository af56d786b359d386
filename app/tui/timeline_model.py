"""The timeline's model: which booking is where (card rows down, time columns across), what each pool takes in
each column, and where the cursor and the selection are. Pure: no Textual, so it is tested without an app;
app.tui.widgets.timeline draws it and turns keys and clicks into calls here.

`set_bookings` paints an owner grid (row x column -> booking) once per data change, so the widget's repaint
is a lookup. What a pool takes in a column is the policy's answer (app.core.policy.open_classes), never a
reckoning of its own; which project's allocation holds a card in a column is app.core.projects.allocation_spans'.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta, tzinfo
from typing import Sequence

from rich.cells import cell_len

from app.config import CLASSES, Config, Pool
from app.core.ical import card_ranges
from app.core.policy import open_classes
from app.core.projects import Held, allocation_cards, allocation_spans
from app.core.text import host_cards, inert
from app.gpu.model import CardReading
from app.model import Booking
from app.tui.render import NOTICE_MARK, abbreviate, holder, local

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
    host: str | None = None  # another host's card (labelled 'gpu2:0'); None: this host's


@dataclass(frozen=True, slots=True)
class Moved:
    """What a cursor move changed: the rows to repaint, whether the time shown moved (the grid is new and the
    bookings of another window are wanted), and whether the rows scrolled (every line is new)."""

    rows: frozenset[int]
    view: bool = False
    scrolled: bool = False


# How a pools row names the classes allowed in a stretch of time, longest first, as room allows.
SHORT_CLASS = {"online": "on", "batch": "ba", "finetune": "ft", "experiment": "ex"}


def align(epoch: float, step: int) -> int:
    """Round down to a step boundary in local time, so 30-minute columns start at :00 and :30."""
    offset = local(epoch).utcoffset() or timedelta(0)
    shift = int(offset.total_seconds())
    return int((epoch + shift) // step * step - shift)


def default_window(now: float) -> tuple[int, int]:
    """The span of time the timeline opens on at `now`: its bookings are the first the board loads."""
    zoom = ZOOMS[DEFAULT_ZOOM]
    start = align(now, zoom.step) - zoom.before
    return start, start + zoom.step * zoom.columns


def rule_words(pool: Pool, allowed: tuple[str, ...], room: int) -> list[tuple[str, str]]:
    """The classes `pool` allows, as (text, style) pieces in the longest form that fits `room` cells: 'finetune',
    then 'ft', then 'f'. The style is "rule" or "rule-<class>"; no form fits: []."""
    cap = [(f" ≤{pool.max_hours:g}h", "rule")] if pool.max_hours is not None else []
    if not allowed:
        forms = [[("closed", "rule")]]
    elif set(allowed) == set(CLASSES):
        forms = [[("any class", "rule"), *cap], [("any", "rule"), *cap], [("any", "rule")]]
    else:
        forms = []
        for short, gap in ((False, " "), (True, " "), (True, "")):
            words: list[tuple[str, str]] = []
            for k in allowed:
                if words and gap:
                    words.append((gap, "rule"))
                words.append(((SHORT_CLASS[k] if gap else k[0]) if short else k, f"rule-{k}"))
            forms += [[*words, *cap], words]
    for words in forms:
        if sum(len(text) for text, _ in words) <= room:
            return words
    return []


def held_words(cards: tuple[int, ...], room: int) -> str:
    """What a project's row says over its allocation's hours, in the longest form that fits `room` cells:
    'holds cards 0-3', then 'cards 0-3', then '0-3'; none fits (or no cards held there): ''."""
    if not cards:
        return ""
    ranges = card_ranges(cards)
    return next((text for text in (f"holds cards {ranges}", f"cards {ranges}", ranges) if len(text) <= room), "")


class TimelineModel:
    """The cards, the bookings in view, the zoom and the window of time, the cursor and the selection."""

    def __init__(self, me: str, now: float, *, pools: Sequence[Pool] = (), zone: tzinfo | None = None,
                 projects: Config | None = None) -> None:
        self.me = me
        self.now = now
        self.pools = tuple(pools)
        self.zone = zone  # where the pools' and the allocations' windows are read (app.core.policy.policy_zone)
        self.projects = projects  # the config whose [[projects]] allocations are drawn; None: no projects
        self.project_rows: list[str] = []  # the projects holding some of this host's cards: one row each
        self.held: list[list[Held | None]] = []  # per card row, per column: the allocation window holding it
        self.holding: list[list[tuple[int, ...]]] = []  # per project row, per column: the cards it holds
        self.rows: list[Row] = []
        self.row_pool: list[int | None] = []  # each card row's pool, an index into pools
        self.pool_rows: list[int] = []  # the pools with cards in the fleet, one rules row each
        self.allowed: list[list[tuple[str, ...]]] = []  # per pools row, per column: the classes it takes
        self.bookings: tuple[Booking, ...] = ()
        self.zoom_index = DEFAULT_ZOOM
        self.view_start = default_window(now)[0]
        self.cursor = (0, self.column_of(now))
        self.anchor: tuple[int, int] | None = None
        self.marking = False
        self.row_offset = 0
        self.label_width = 3
        self.grid: list[list[Booking | None]] = []

    # -- time and columns ----------------------------------------------------------------------

    @property
    def zoom(self) -> Zoom:
        return ZOOMS[self.zoom_index]

    @property
    def view_end(self) -> int:
        return self.view_start + self.zoom.step * self.zoom.columns

    def column_of(self, epoch: float) -> int:
        return int((epoch - self.view_start) // self.zoom.step)

    def column_time(self, column: int) -> int:
        return self.view_start + column * self.zoom.step

    def pool_of(self, row: int) -> Pool | None:
        """The pool a card row belongs to, if any."""
        pool = self.row_pool[row] if 0 <= row < len(self.row_pool) else None
        return self.pools[pool] if pool is not None else None

    # -- data ----------------------------------------------------------------------------------

    def set_cards(self, cards: Sequence[CardReading], labels: dict[int, str] | None = None, wide: bool = False,
                  hosts: Sequence[str | None] = (), here: str = "") -> bool:
        """Rows for the cards, labelled 'index label' with the label shortened to fit (app.tui.render.abbreviate);
        `hosts`, one per card, names another host's (None: this host's), labelled as --cards names it: 'gpu2:0'.
        With another host's cards beside them, this host's carry its name `here` too ('gpu1:0'): every row says
        whose card it is. True when the rows or their labels' width changed."""
        labels = labels or {}
        hosts = list(hosts) or [None] * len(cards)
        local = [card for card, host in zip(cards, hosts) if host is None]
        mine = here if len(local) < len(cards) else ""  # one host: a plain index, as today
        named = [(card, host, inert(labels.get(card.index, card.label) or "") if host is None else "")
                 for card, host in zip(cards, hosts)]
        widest = max((cell_len(f"{host_cards([c.index], host or mine)} {name}".rstrip()) for c, host, name in named),
                     default=1)
        project_rows = self._projects_holding(local)
        band_names = max((cell_len(inert(name)) for name in (*(self.pools[p].name for p in self._pools_of(local)),
                                                               *project_rows)), default=0)
        width = max(3, min(12 if wide else 9, max(widest, min(band_names, 8)) + 1))
        rows = []
        for card, host, name in named:
            index = host_cards([card.index], host or mine)
            text = f"{index} {abbreviate(name, width - len(index) - 2)}" if name and width - len(index) > 3 else index
            rows.append(Row(card.index, card.uuid, abbreviate(text, width - 1), card.lost, host))
        if rows == self.rows and width == self.label_width:
            return False
        self.rows = rows
        self.label_width = width
        # A card in two pools is shaded as the first one's (the policy applies both).
        pool_of = {card: n for n, pool in reversed(list(enumerate(self.pools))) for card in pool.cards}
        self.row_pool = [pool_of.get(r.index) if r.host is None else None for r in rows]  # pools: this host's cards
        self.pool_rows = sorted(p for p in set(self.row_pool) if p is not None)
        self.project_rows = project_rows
        self.cursor = (min(self.cursor[0], max(0, len(rows) - 1)), self.cursor[1])
        self.rebuild()
        return True

    def _projects_holding(self, cards: Sequence[CardReading]) -> list[str]:
        """The projects whose allocations hold some of `cards` (this host's: allocations name its cards)."""
        config = self.projects or Config()
        indexes = {c.index for c in cards}
        return [p.name for p in config.projects
                if indexes & {c for a in p.allocations for c in allocation_cards(config, a)}]

    def _pools_of(self, cards: Sequence[CardReading]) -> set[int]:
        indexes = {c.index for c in cards}
        return {n for n, pool in enumerate(self.pools) if indexes & set(pool.cards)}

    def set_bookings(self, bookings: Sequence[Booking]) -> None:
        self.bookings = tuple(bookings)
        self.rebuild()

    def set_now(self, now: float) -> bool:
        """Move now; True when it moved into another column."""
        old = self.column_of(self.now)
        self.now = now
        return self.column_of(now) != old

    def rebuild(self) -> None:
        """Which booking owns each (card row, column), and what each pool takes in each column. A booking claims
        its cells unless an earlier one did."""
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
        self.grid = grid
        self.allowed = [[open_classes(self.pools[p], start + c * step, start + (c + 1) * step, self.zone)
                         for c in range(columns)] for p in self.pool_rows]
        self._hold(start, end)

    def _hold(self, start: int, end: int) -> None:
        """Which allocation window holds each (card row, column) it meets, and what each project row holds per
        column. A cell two windows meet is the first's (by start); a booking drawn there covers it."""
        columns, step = self.zoom.columns, self.zoom.step
        self.held = [[None] * columns for _ in self.rows]
        self.holding = [[()] * columns for _ in self.project_rows]
        if not self.project_rows or self.projects is None:
            return
        rows_of: dict[int, list[int]] = {}
        for i, r in enumerate(self.rows):
            if r.host is None:
                rows_of.setdefault(r.index, []).append(i)
        for held in allocation_spans(self.projects, start, end, self.zone):
            if held.project not in self.project_rows:
                continue
            c0 = max(0, (held.start - start) // step)
            c1 = min(columns, -(-(held.end - start) // step))
            line = self.holding[self.project_rows.index(held.project)]
            for c in range(c0, c1):
                line[c] = tuple(sorted({*line[c], *(card for card in held.cards if card in rows_of)}))
            for card in held.cards:
                for row in rows_of.get(card, ()):
                    cells = self.held[row]
                    for c in range(c0, c1):
                        if cells[c] is None:
                            cells[c] = held

    def held_at(self, row: int, column: int) -> Held | None:
        """The allocation window that holds the card of `row` in `column`, if any."""
        if 0 <= row < len(self.held) and 0 <= column < len(self.held[row]):
            return self.held[row][column]
        return None

    def booking_at(self, row: int, column: int) -> Booking | None:
        if 0 <= row < len(self.grid) and 0 <= column < len(self.grid[row]):
            return self.grid[row][column]
        return None

    def block_label(self, booking: Booking, row: int, column: int) -> str:
        """The user on the top row of a block; lower rows of the same booking stay blank, so it reads as one."""
        if row > 0 and self.grid[row - 1][column] is booking:
            return ""
        label = holder(booking)
        if booking.notice:  # someone else changed it: the detail line below says what
            label = f"{NOTICE_MARK} {label}"
        if len(booking.cards) > 1:
            label += f" ×{len(booking.cards)}"
        return label

    # -- cursor and selection ------------------------------------------------------------------

    def selection(self) -> tuple[int, int, int, int] | None:
        """(first row, last row, first column, last column) between the anchor and the cursor, or None."""
        if self.anchor is None:
            return None
        (r0, c0), (r1, c1) = self.anchor, self.cursor
        return min(r0, r1), max(r0, r1), min(c0, c1), max(c0, c1)

    def selected_rows(self) -> set[int]:
        selection = self.selection()
        rows = {self.cursor[0]}
        if selection:
            rows |= set(range(selection[0], selection[1] + 1))
        return rows

    def selected_range(self) -> tuple[list[int], int, int] | None:
        """(card indexes, start, end) of the selection, or of the cursor cell when nothing is selected."""
        if not self.rows:
            return None
        selection = self.selection() or (self.cursor[0], self.cursor[0], self.cursor[1], self.cursor[1])
        r0, r1, c0, c1 = selection
        host = self.selected_host()
        cards = [self.rows[r].index for r in range(r0, r1 + 1) if self.rows[r].host == host]
        return cards, self.column_time(c0), self.column_time(c1 + 1)

    def selected_host(self) -> str | None:
        """The host of the selection's cards (the cursor's row's): None for this host's. A booking's cards are on
        one host, so selected_range's cards are those of the rows on the cursor's host."""
        return self.rows[self.cursor[0]].host if self.rows else None

    def cursor_cell(self) -> tuple[Booking | None, Row | None, int, int]:
        """What is under the cursor: (its booking, its card, the cell's start and end)."""
        row, column = self.cursor
        card = self.rows[row] if 0 <= row < len(self.rows) else None
        start = self.column_time(column)
        return self.booking_at(row, column), card, start, start + self.zoom.step

    def move_cursor(self, row: int, column: int, *, extend: bool, visible_rows: int) -> Moved | None:
        """The cursor to (row, column): a column outside the view moves the time shown, a row outside the
        `visible_rows` scrolls them. `extend` grows the selection from where the cursor was. None: no cards."""
        if not self.rows:
            return None
        row = min(max(row, 0), len(self.rows) - 1)
        old_rows = self.selected_rows()
        shift = 0
        if column < 0 or column >= self.zoom.columns:
            shift = column if column < 0 else column - self.zoom.columns + 1
            self.view_start += shift * self.zoom.step
            self.rebuild()
            column -= shift
            if self.anchor is not None:
                self.anchor = (self.anchor[0], self.anchor[1] - shift)
        if extend and self.anchor is None:
            self.anchor = self.cursor
        elif not extend and not self.marking:
            self.anchor = None
        self.cursor = (row, column)
        scrolled = False
        if row < self.row_offset:
            self.row_offset, scrolled = row, True
        elif visible_rows and row >= self.row_offset + visible_rows:
            self.row_offset, scrolled = row - visible_rows + 1, True
        return Moved(frozenset(old_rows | self.selected_rows()), view=bool(shift), scrolled=scrolled)

    def mark(self) -> set[int]:
        """Start a selection at the cursor that moves then grow, or end it; the rows to repaint."""
        self.marking = not self.marking
        if self.marking:
            self.anchor = self.cursor
        return self.selected_rows()

    def clear_selection(self) -> set[int]:
        rows = self.selected_rows()
        self.anchor, self.marking = None, False
        return rows

    def press(self, row: int, column: int, *, visible_rows: int) -> Moved | None:
        """A click on a cell: the cursor there, and a selection anchored there that a drag grows."""
        self.marking = False
        self.anchor = None
        moved = self.move_cursor(row, column, extend=False, visible_rows=visible_rows)
        self.anchor = (row, column)
        return moved

    def release(self) -> None:
        """The button is up: a click that did not drag selects nothing."""
        if self.anchor == self.cursor:
            self.anchor = None

    def scroll_time(self, seconds: int) -> None:
        self.view_start += seconds
        self.rebuild()

    def jump_to_now(self) -> None:
        self.view_start = align(self.now, self.zoom.step) - self.zoom.before
        self.anchor, self.marking = None, False
        self.cursor = (self.cursor[0], self.column_of(self.now))
        self.rebuild()

    def set_zoom(self, index: int) -> None:
        """Another zoom around the cursor's time: the default view when that holds it, else one a quarter in."""
        focus = self.column_time(self.cursor[1])
        self.zoom_index = index
        self.view_start = align(self.now, self.zoom.step) - self.zoom.before
        if not self.view_start <= focus < self.view_end:
            self.view_start = align(focus, self.zoom.step) - self.zoom.columns // 4 * self.zoom.step
        self.anchor, self.marking = None, False
        self.cursor = (self.cursor[0], self.column_of(focus))
        self.rebuild()

    def scroll_rows(self, delta: int, visible_rows: int) -> bool:
        """Scroll the card rows by `delta`, within bounds; True when they moved."""
        most = max(0, len(self.rows) - visible_rows)
        offset = min(max(self.row_offset + delta, 0), most)
        if offset == self.row_offset:
            return False
        self.row_offset = offset
        return True

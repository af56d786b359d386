"""The live card table: one row per card, keyed by its UUID, diffed cell by cell on every poll."""

from __future__ import annotations

import math
from typing import Sequence

from rich.cells import cell_len
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from textual.widgets import DataTable

from app.core.cardstate import BOOKED, FREE, FULL, HOT, IN_USE, LOST, SQUATTED, CardStatus
from app.core.text import inert
from app.gpu.model import CardReading
from app.model import Booking
from app.tui.render import NA, abbreviate, bar, gib, level_style, local, short_time

STATE_CLASS = {FREE: "free", BOOKED: "booked", IN_USE: "in-use", SQUATTED: "squatted", LOST: "lost"}
WIDE_MIN_WIDTH = 110
OVER = "OVER"  # the holder uses more VRAM than the booking's request estimated
OVER_MARGIN = 0.05


def requested_mib(booking: Booking | None, uuid: str) -> float | None:
    """The VRAM the booking's request estimated for this card (request["per_card_mib"], one per card in
    the booking's card order), or None. The request is what the booker sent: anything malformed is None."""
    request = booking.request if booking is not None else None
    if not isinstance(request, dict) or uuid not in booking.card_uuids:
        return None
    per_card = request.get("per_card_mib")
    if not isinstance(per_card, list) or len(per_card) != len(booking.card_uuids):
        return None
    mib = per_card[booking.card_uuids.index(uuid)]
    if isinstance(mib, bool) or not isinstance(mib, (int, float)) or not math.isfinite(mib) or mib <= 0:
        return None
    return mib


def holder_mib(reading: CardReading, booking: Booking) -> int | None:
    """The VRAM of the holder's processes on the card, or None when NVML reports none. A process nobody
    can name (a container's) counts as the holder's, as the card's state does (app.core.cardstate)."""
    def holders(p) -> bool:
        if p.uid is not None:
            return p.uid == booking.uid
        return p.user == booking.user if p.user is not None else True

    used = [p.used_mib for p in reading.processes if p.used_mib is not None and holders(p)]
    return sum(used) if used else None


def over_request(reading: CardReading, booking: Booking | None) -> bool:
    requested = requested_mib(booking, reading.uuid)
    if requested is None:
        return False
    used = holder_mib(reading, booking)
    return used is not None and used > requested * (1 + OVER_MARGIN)


def short_name(name: str | None) -> str:
    if not name:
        return NA
    for prefix in ("NVIDIA GeForce ", "NVIDIA "):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def compact_time(epoch: float, now: float) -> str:
    """'19:00' today, else 'Wed 10h': a time without its day would read as today's."""
    if local(epoch).date() == local(now).date():
        return local(epoch).strftime("%H:%M")
    return local(epoch).strftime("%a %Hh")


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
        self.statuses: tuple[CardStatus, ...] = ()
        self._requested = False  # the wide VRAM column has room for requests

    # -- repainting only what changed ------------------------------------------------------------

    def update_cell(self, row_key, column_key, value, *, update_width: bool = False) -> None:
        """DataTable.update_cell repaints the whole table; a poll changes a few rows, so repaint just those.

        Cuts the board's idle CPU by a third and what it writes to the terminal by ~3x (bench/bench_tui.py).
        """
        self._quiet = True
        try:
            super().update_cell(row_key, column_key, value, update_width=update_width)
        finally:
            self._quiet = False
        self._changed_rows.add(row_key)

    def _repaint_changed_rows(self) -> None:
        for row_key in self._changed_rows:
            self.refresh_row(self.get_row_index(row_key))
        self._changed_rows.clear()

    def refresh(self, *regions, **kwargs):
        if getattr(self, "_quiet", False) and not regions and not kwargs:
            return self
        return super().refresh(*regions, **kwargs)

    # -- columns -------------------------------------------------------------------------------

    def _columns(self, wide: bool, mixed: bool, width: int, requested: bool = False) -> list[tuple[str, str, int]]:
        if not wide:
            return [("idx", "#", 2), ("state", "STATE", 12), ("vram", "VRAM GiB", 11), ("util", "UTIL", 4),
                    ("temp", "TEMP", 4), ("power", "POWER", 5), ("holder", "HOLDER", 13), ("next", "NEXT", 13)]
        labelled = any(st.label for st in self.statuses)
        columns = [("idx", "#", 8 if labelled else 2)]
        if mixed:
            columns.append(("gpu", "GPU", 10))
        # A booking's request adds " req 21.3" to its cards' VRAM: six more columns (from the users column).
        columns += [("state", "STATE", 15), ("vram", "VRAM GiB", 26 if requested else 20), ("util", "UTIL", 4),
                    ("temp", "TEMP", 4), ("power", "POWER W", 7), ("holder", "HOLDER", 17), ("next", "NEXT", 16)]
        used = sum(w + 2 for _, _, w in columns) + 2 + 1  # padding, the users column's padding, a scrollbar
        columns.append(("users", "USERS", max(10, width - used)))
        return columns

    # -- data ----------------------------------------------------------------------------------

    def show(self, statuses: Sequence[CardStatus], now: float) -> None:
        """Diff the table against new statuses: only changed cells are touched; rows keep their keys."""
        self.statuses = tuple(statuses)
        width = self.size.width or self.app.size.width
        wide = self.app.size.width >= WIDE_MIN_WIDTH
        mixed = len({s.reading.name for s in statuses}) > 1
        requested = wide and any(requested_mib(s.booking, s.reading.uuid) is not None for s in statuses)
        self._requested = requested
        layout = (wide, mixed, width if wide else 0, any(s.label for s in statuses), requested)
        uuids = [s.reading.uuid for s in statuses]
        with self.app.batch_update():
            if layout != self._layout:
                self.clear(columns=True)
                for key, label, w in self._columns(wide, mixed, width, requested):
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
        """Every cell of a row; `_parts` does the formatting, this only builds what changed."""
        cells = {}
        uuid = s.reading.uuid
        for column, spec in self._parts(s, now, wide).items():
            cached = self._built.get((uuid, column))
            if cached is None or cached[0] != spec:
                parts, justify = spec
                cell = Cell([(plain, self._style(style) if style else None) for plain, style in parts], justify)
                cached = self._built[(uuid, column)] = (spec, cell)
            cells[column] = cached[1]
        return cells

    def _parts(self, s: CardStatus, now: float, wide: bool) -> dict[str, tuple]:
        """Each cell as plain ((text, component class), ...) pieces: cheap to make and to compare every poll."""
        r = s.reading
        cells: dict[str, tuple] = {}
        if wide and s.label:
            cells["idx"] = (((f"{r.index} ", ""), (abbreviate(inert(s.label), 6), "cards--muted")), "left")
        else:
            cells["idx"] = (((str(r.index), ""),), "left")
        cells["gpu"] = (((inert(short_name(r.name), 10), ""),), "left")
        state = [(s.state, f"cards--{STATE_CLASS.get(s.state, 'na')}")]
        for warning in s.warnings:
            state += [(" ", ""), (warning, "cards--warning")]
        over = over_request(r, s.booking)
        if over:
            state += [(" ", ""), (OVER, "cards--warn")]
        cells["state"] = (tuple(state), "left")

        total, used = r.memory_total_mib, r.memory_used_mib
        fraction = used / total if used is not None and total else None
        level = "cards--danger" if FULL in s.warnings else f"cards--{level_style(fraction, 0.7, 0.9)}"
        if wide:
            figures = " " + (NA if used is None else f"{gib(used)}/{gib(total)}")
        else:
            figures = " " + (NA if fraction is None else f"{used / 1024:.0f}/{total / 1024:.0f}")
        vram = [(bar(fraction, 7 if self._requested else 8 if wide else 5), level), (figures, "")]
        requested = requested_mib(s.booking, r.uuid) if self._requested else None
        if requested is not None:
            vram.append((f" req {requested / 1024:.1f}", "cards--warn" if over else "cards--muted"))
        cells["vram"] = (tuple(vram), "left")

        util = r.utilization_pct
        cells["util"] = (((NA, "cards--na") if util is None else (f"{util}%", ""),), "right")
        temp = r.temperature_c
        temp_style = "cards--danger" if HOT in s.warnings else ("cards--na" if temp is None else "cards--ok")
        cells["temp"] = (((NA if temp is None else (f"{temp}°C" if wide else f"{temp}°"), temp_style),), "right")
        if r.power_w is None:
            power = NA
        elif wide:
            power = f"{r.power_w:.0f}/{r.power_limit_w:.0f}" if r.power_limit_w else f"{r.power_w:.0f}"
        else:
            power = f"{r.power_w:.0f}W"
        power_fraction = r.power_w / r.power_limit_w if r.power_w is not None and r.power_limit_w else None
        cells["power"] = (((power, f"cards--{level_style(power_fraction, 0.8, 0.95)}"),), "right")

        when = short_time if wide else compact_time
        # A space between two runs goes with the first: an SVG screenshot's renderer may drop a run's leading spaces.
        if s.booking:
            mine = "cards--mine" if s.booking.user == self.me else ""
            user = inert(s.booking.user, 8) + (" " if wide else "")
            until = f"→ {when(s.booking.end, now)}" if wide else f"→{when(s.booking.end, now)}"
            cells["holder"] = (((user, mine), (until, "")), "left")
        else:
            cells["holder"] = ((("-", "cards--muted"),), "left")
        if s.next_booking:
            mine = "cards--mine" if s.next_booking.user == self.me else ""
            cells["next"] = (((inert(s.next_booking.user, 7) + " ", mine), (when(s.next_booking.start, now), "")),
                             "left")
        else:
            cells["next"] = ((("-", "cards--muted"),), "left")
        cells["users"] = (((inert(", ".join(s.users), 60), ""),) if s.users else (("-", "cards--muted"),), "left")
        return cells

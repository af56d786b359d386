"""The card table's model: which columns the terminal's width allows, and what each cell says in which style.
Pure (no Textual), so it is tested without an app; app.tui.widgets.card_table draws it and diffs the table."""

from __future__ import annotations

import math
from typing import Sequence

from app.core.cardstate import BOOKED, FREE, FULL, HOT, IN_USE, LOST, SQUATTED, CardStatus
from app.core.text import inert
from app.gpu.model import CardReading
from app.model import Booking
from app.tui.render import NA, abbreviate, bar, gib, holder, level_style, local, short_time

STATE_CLASS = {FREE: "free", BOOKED: "booked", IN_USE: "in-use", SQUATTED: "squatted", LOST: "lost"}
WIDE_MIN_WIDTH = 110
OVER = "OVER"  # the holder uses more VRAM than the booking's request estimated
OVER_MARGIN = 0.05


def requested_mib(booking: Booking | None, uuid: str) -> float | None:
    """The VRAM the booking's request estimated for this card (request["per_card_mib"], one per card in
    the booking's card order), or None. The request is what the booker sent: anything malformed is None."""
    if booking is None or not isinstance(request := booking.request, dict) or uuid not in booking.card_uuids:
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
    if requested is None or booking is None:  # (no booking: nothing requested)
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


def wants_requests(statuses: Sequence[CardStatus], wide: bool) -> bool:
    """Whether the VRAM column shows bookings' requests: only wide, and only when some booking has one."""
    return wide and any(requested_mib(s.booking, s.reading.uuid) is not None for s in statuses)


# The HOLDER and NEXT columns' widths, compact and wide: a name gives way to the time beside it (`_named_time`).
HOLDER_WIDTH, NEXT_WIDTH = {False: 13, True: 17}, {False: 13, True: 16}


def table_columns(statuses: Sequence[CardStatus], wide: bool, width: int,
                  with_requests: bool = False) -> list[tuple[str, str, int]]:
    """(key, title, width) of each column: the compact set (80 columns), or the wide one that fills `width`."""
    if not wide:
        return [("idx", "#", 2), ("state", "STATE", 12), ("vram", "VRAM GiB", 11), ("util", "UTIL", 4),
                ("temp", "TEMP", 4), ("power", "POWER", 5), ("holder", "HOLDER", HOLDER_WIDTH[False]),
                ("next", "NEXT", NEXT_WIDTH[False])]
    labelled = any(st.label for st in statuses)
    found = [("idx", "#", 8 if labelled else 2)]
    if len({s.reading.name for s in statuses}) > 1:
        found.append(("gpu", "GPU", 10))
    # A booking's request adds " req 21.3" to its cards' VRAM: six more columns (from the users column).
    found += [("state", "STATE", 15), ("vram", "VRAM GiB", 26 if with_requests else 20), ("util", "UTIL", 4),
              ("temp", "TEMP", 4), ("power", "POWER W", 7), ("holder", "HOLDER", HOLDER_WIDTH[True]),
              ("next", "NEXT", NEXT_WIDTH[True])]
    used = sum(w + 2 for _, _, w in found) + 2 + 1  # padding, the users column's padding, a scrollbar
    found.append(("users", "USERS", max(10, width - used)))
    return found


def cell_parts(s: CardStatus, now: float, *, me: str, wide: bool, with_requests: bool = False) -> dict[str, tuple]:
    """Each cell of a card's row as plain ((text, component class), ...) pieces and its justification: cheap to make
    and to compare every poll. `me` marks my bookings; `with_requests`: the VRAM column has room for requests."""
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
        figures = " " + (NA if used is None or not total else f"{used / 1024:.0f}/{total / 1024:.0f}")
    vram = [(bar(fraction, 7 if with_requests else 8 if wide else 5), level), (figures, "")]
    requested = requested_mib(s.booking, r.uuid) if with_requests else None
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
        mine = "cards--mine" if s.booking.user == me else ""
        until = f"→ {when(s.booking.end, now)}" if wide else f"→{when(s.booking.end, now)}"
        gap = " " if wide else ""
        name = holder(s.booking, max(1, HOLDER_WIDTH[wide] - len(gap) - len(until)))  # its project gives way first
        cells["holder"] = (_named_time(name, gap, until, HOLDER_WIDTH[wide], mine), "left")
    else:
        cells["holder"] = ((("-", "cards--muted"),), "left")
    if s.next_booking:
        mine = "cards--mine" if s.next_booking.user == me else ""
        cells["next"] = (_named_time(s.next_booking.user, " ", when(s.next_booking.start, now), NEXT_WIDTH[wide], mine),
                         "left")
    else:
        cells["next"] = ((("-", "cards--muted"),), "left")
    cells["users"] = (((inert(", ".join(s.users), 60), ""),) if s.users else (("-", "cards--muted"),), "left")
    if s.down_since is not None:  # its host's service is silent: what it last read is stale, so blank
        cells["state"] = (((host_down(s.down_since, now), "cards--lost"),), "left")
        for column in BLANKED_WHEN_DOWN:
            cells[column] = ((), "left")
    return cells


def _named_time(user: str, gap: str, time_text: str, width: int, style: str) -> tuple:
    """A user (the holder's 'alice·A' with the project) and a time in `width` cells: the name gives way
    ('aud4_alic…→06:00'), never the time."""
    name = inert(user, max(1, width - len(gap) - len(time_text)))
    return (name + gap, style), (time_text, "")


BLANKED_WHEN_DOWN = ("vram", "util", "temp", "power", "users")  # the state cell spills into them (CardTable)


def host_down(since: float, now: float) -> str:
    """'HOST DOWN (since 14:02)': a card whose host's heartbeat is late, since its last one."""
    return f"HOST DOWN (since {compact_time(since, now)})"


def host_groups(statuses: Sequence[CardStatus]) -> list[str] | None:
    """The hosts whose cards the table shows, in order, when there is more than one (each gets a heading);
    None for one host: today's table."""
    hosts = list(dict.fromkeys(s.host for s in statuses))
    return hosts if len(hosts) > 1 else None

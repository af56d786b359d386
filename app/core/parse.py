"""The one parser for each small grammar people type: card lists, ids and time spans. The CLI, the TUI
and the service all read them here, so `4-7` or `tomorrow 9-19` means the same thing everywhere.

Only ASCII digits count: Python's int() also reads Arabic-Indic, Devanagari and fullwidth digits,
signs, underscores and surrounding whitespace, none of which a card or booking number is written with.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timezone

from app.core.text import inert
from app.errors import BadInput

MAX_CARD = 4096
MAX_ID = 2**63  # SQLite's INTEGER is signed 64-bit; ids run from 1 to MAX_ID - 1

_CARD_PART = re.compile(r"([0-9]+)(?:[ \t]*-[ \t]*([0-9]+))?")
_DIGITS = re.compile(r"[0-9]+")
_HOST_PART = re.compile(r"[ \t]*([A-Za-z0-9_-]{1,63})[ \t]*:(.*)", re.DOTALL)
_LISTINGS = {"booking": "'board list' shows the bookings", "server": "'board serve list' shows the servers"}


def _shown(text: str) -> str:
    return inert(text, 40)


def parse_cards(text: str, said: str | None = None) -> list[int]:
    """'0,1', '4-7', '0, 2-3' -> the card indexes, sorted, each once.

    Parts are separated by commas, with spaces allowed around them; a part is an index or an
    inclusive range low-high. Empty parts, backward ranges and indexes above MAX_CARD are BadInput, quoting
    `said` (what was typed, with its host) or else `text`.
    """
    said = text if said is None else said
    cards: set[int] = set()
    for part in text.split(","):
        found = _CARD_PART.fullmatch(part.strip(" \t"))
        if found is None:
            raise _unreadable(said)
        low, high = found[1], found[2] if found[2] is not None else found[1]
        if max(len(low), len(high)) > len(str(MAX_CARD)) or int(high) > MAX_CARD:
            raise _unreadable(said, f"cards run from 0 to {MAX_CARD}")
        if int(high) < int(low):
            raise _unreadable(said, f"the range {int(low)}-{int(high)} runs backwards")
        cards.update(range(int(low), int(high) + 1))
    return sorted(cards)


def parse_card_spec(text: str) -> tuple[str | None, list[int]]:
    """'0-3' -> (None, [0, 1, 2, 3]): this host's cards; 'gpu2:0-3' or 'gpu2:3' -> ('gpu2', ...): another host's.

    A host prefix names the host of the list that follows it ('gpu2:0,1' is two cards on gpu2); a booking's cards
    are on one host, so a list naming two hosts (or a plain number before a host's) is BadInput."""
    host, cards = None, []
    for number, part in enumerate(text.split(",")):
        named = _HOST_PART.fullmatch(part)
        if named is not None:
            if number > 0 and named[1] != host:
                raise BadInput(f"'{_shown(text.strip())}' names cards on more than one host; a booking's cards are"
                               " on one host (such as gpu2:0-3)")
            host, part = named[1], named[2]
        cards.append(part)
    return host, parse_cards(",".join(cards), text)


def _unreadable(text: str, why: str | None = None) -> BadInput:
    reason = f" ({why})" if why else ""
    return BadInput(f"can't read cards '{_shown(text.strip())}'{reason}; give indexes such as 0,1 or 4-7")


def parse_id(text: str, what: str = "booking") -> int:
    """A booking (or server, ...) number: ASCII digits only, 0 < n < 2**63; BadInput otherwise.

    Something that is not a number at all says so; a number that cannot be an id (zero, a sign,
    too large, digits from another script) says there is no such `what`, and where to look.
    """
    digits = text.strip(" \t")
    if _DIGITS.fullmatch(digits) and len(digits) <= len(str(MAX_ID)) and 0 < int(digits) < MAX_ID:
        return int(digits)
    if not _DIGITS.fullmatch(digits) and not _python_reads_a_number(text):
        raise BadInput(f"invalid int value: '{_shown(text)}'; give a {what} number such as 12")
    hint = _LISTINGS.get(what)
    raise BadInput(f"there is no {what} {_shown(digits)}" + (f"; {hint}" if hint else ""))


def _python_reads_a_number(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def parse_span(start: str, length: str | None, until: str | None, now: datetime, *, how_long: str,
               night_start: int | Callable[[], int] | None = None, notes: list[str] | None = None) -> tuple[int, int]:
    """A start (a time, or a range such as 'tomorrow 9-19') with a duration or an end, as UTC epoch seconds.

    `--until` reads as timeparse.parse_end says: day words from now, a bare time and `+2h` from the start.
    `how_long` is the line to show when neither a duration, an end nor a range says how long;
    `night_start` is what `tonight` means (default 19:00), asked only when someone says it. A wall time
    the clocks skip is BadInput; `notes` gets a line for one they show twice (which was taken)."""
    # start-up: only commands that take times load the time grammar (`board cancel 3` takes none)
    from app.core.timeparse import NIGHT_START, TimeInputError, parse_duration, parse_end, parse_when_or_range

    night = NIGHT_START if night_start is None else night_start
    try:
        begin, range_end = parse_when_or_range(start, now, night_start=night, notes=notes)
        if length is not None:
            # elapsed time, as `+2h` is: in a real zone (ZoneInfo) datetime arithmetic is wall-clock, and 1h from
            # 02:30 on the night the clocks go back would be two
            end = begin.astimezone(timezone.utc) + parse_duration(length)
        elif until is not None:
            end = parse_end(until, begin, now, night_start=night, notes=notes)
        elif range_end is not None:
            end = range_end
        else:
            raise BadInput(how_long)
    except TimeInputError as error:
        raise BadInput(str(error)) from None
    except OverflowError:
        raise BadInput("that time is out of range") from None
    return int(begin.timestamp()), int(end.timestamp())

"""Text for people: other users' text made inert for terminals, and short local times.

Times are worded here alone. The service words its messages for people in other zones (a cloud
server on UTC, a team in Asia/Shanghai), so it writes each time as a stamp (`stamp_time`,
`stamp_when`, `stamp_day`: the epoch and the service's now) and the reader's client words the
stamps (`localize`) in the reader's own zone, at its one door (app.client), as format_time would.
"""

from __future__ import annotations

import os
import re
import time
import unicodedata
from datetime import datetime, tzinfo
from collections.abc import Sequence

_SAFE_FORMAT = {"\u200d"}  # zero-width joiner inside emoji sequences is harmless; everything else Cf is shown


def inert(text: str, limit: int | None = None) -> str:
    """Control characters (C0, C1, DEL) and format characters (bidi overrides, zero-width) become visible escapes."""
    out = []
    for char in text:
        category = unicodedata.category(char)
        if category == "Cc" or (category == "Cf" and char not in _SAFE_FORMAT) or category in ("Zl", "Zp"):
            out.append(f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        else:
            out.append(char)
    result = "".join(out)
    if limit is not None and len(result) > limit:
        result = result[: max(limit - 1, 0)] + "…"
    return result


def _local(epoch: float, tz: tzinfo | None) -> datetime:
    return datetime.fromtimestamp(epoch, tz) if tz is not None else datetime.fromtimestamp(epoch).astimezone()


def format_time(epoch: int, now: float | None = None, tz: tzinfo | None = None) -> str:
    """A short local time (in `tz`, default this process's zone): '14:00' today, 'Tue 14:00' within a week,
    else '2026-12-01 14:00'."""
    moment = _local(epoch, tz)
    today = _local(now if now is not None else time.time(), tz).date()
    if moment.date() == today:
        return moment.strftime("%H:%M")
    if 0 < (moment.date() - today).days < 7:
        return moment.strftime("%a %H:%M")
    return moment.strftime("%Y-%m-%d %H:%M")


def relative(epoch: float, now: float) -> str:
    """How far away a time is: 'in 45 min', 'in 3 h', 'in 2 days', '45 min ago', or 'now' within a minute.

    Minutes under 90 minutes, hours under 36 hours, then days; each rounded to the nearest."""
    seconds = epoch - now
    ahead, span = seconds >= 0, abs(seconds)
    if span < 60:
        return "now"
    if span < 90 * 60:
        amount = f"{round(span / 60)} min"
    elif span < 36 * 3600:
        amount = f"{round(span / 3600)} h"
    else:
        amount = f"{round(span / 86400)} days"
    return f"in {amount}" if ahead else f"{amount} ago"


def format_when(epoch: float, now: float, tz: tzinfo | None = None) -> str:
    """A time and how far away it is: '19:00 (in 45 min)'."""
    return f"{format_time(int(epoch), now, tz)} ({relative(epoch, now)})"


def format_day(epoch: float, tz: tzinfo | None = None) -> str:
    """A time with its weekday and date, whatever now is: 'Mon 2026-12-07 09:00' (the occurrences of a series)."""
    return _local(epoch, tz).strftime("%a %Y-%m-%d %H:%M")


# -- times in messages the service words for someone in another zone -------------------------------

STAMP_MARK = "<@"  # every stamp starts so: a message without it has nothing to word
_STAMP = re.compile(r"<@(time|when|day):(-?\d{1,15})(?::(-?\d{1,15}))?>")


def stamp_time(epoch: float, now: float) -> str:
    """`epoch` as the reader's format_time(epoch, now) will word it."""
    return f"<@time:{int(epoch)}:{int(now)}>"


def stamp_when(epoch: float, now: float) -> str:
    """`epoch` as the reader's format_when(epoch, now) will word it: '19:00 (in 45 min)'."""
    return f"<@when:{int(epoch)}:{int(now)}>"


def stamp_day(epoch: float) -> str:
    """`epoch` as the reader's format_day(epoch) will word it: 'Mon 2026-12-07 09:00'."""
    return f"<@day:{int(epoch)}>"


def localize(text: str, tz: tzinfo | None = None) -> str:
    """`text` with each stamp worded in `tz` (default: this process's zone, the reader's TZ).

    The now a stamp carries is the service's at the time it wrote it, so a message reads as it would
    have read from a service in the reader's zone. A stamp out of range is left as it is."""
    if STAMP_MARK not in text:
        return text

    def word(found: re.Match) -> str:
        how, epoch, now = found.group(1), int(found.group(2)), found.group(3)
        try:
            if how == "day":
                return format_day(epoch, tz)
            if now is None:
                return found.group(0)
            return (format_when if how == "when" else format_time)(epoch, int(now), tz)
        except (OverflowError, OSError, ValueError):
            return found.group(0)

    return _STAMP.sub(word, text)


def zone_name(tz: tzinfo | None = None) -> str:
    """A zone as people name it: 'Asia/Shanghai'. None is this process's zone: TZ, else /etc/localtime's name,
    else its abbreviation ('UTC')."""
    if tz is not None:
        return getattr(tz, "key", None) or datetime.now(tz).tzname() or str(tz)
    named = os.environ.get("TZ", "").lstrip(":")
    if named and not named.startswith("/") and "," not in named:
        return named
    target = os.path.realpath(named or "/etc/localtime")
    if "/zoneinfo/" in target:  # the last: no zone's name holds a zoneinfo folder, a tree's path may
        return target.rsplit("/zoneinfo/", 1)[1]
    return time.strftime("%Z") or "UTC"  # glibc reads a TZ file it cannot read as UTC, with no abbreviation


def format_duration(seconds: float) -> str:
    """'45m', '3h', '1h30m', '2d4h': the same forms the time parser reads."""
    minutes = max(0, int(seconds) // 60)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    return "".join(parts) or "0m"


def format_cards(cards: Sequence[int]) -> str:
    return ",".join(str(c) for c in cards)


def cards_text(cards: Sequence[int], host: str = "", here: str = "") -> str:
    """'card 4' or 'cards 0,1'; another host's 'cards gpu2:0,1' (host_cards)."""
    return f"{'card' if len(cards) == 1 else 'cards'} {host_cards(cards, host, here)}"


def host_cards(cards: Sequence[int], host: str = "", here: str = "") -> str:
    """'0,1' for this host's cards (`host` '' or `here`); 'gpu2:0,1' for another host's, as --cards names them."""
    return (f"{inert(host, 63)}:" if host not in ("", here) else "") + format_cards(cards)


def format_elapsed(seconds: float | None, missing: str = "n/a") -> str:
    """'4:05' under an hour, '3h07m' under a day, then '2d4h'."""
    if seconds is None:
        return missing
    seconds = max(0, int(seconds))
    if seconds < 3600:
        return f"{seconds // 60}:{seconds % 60:02d}"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"

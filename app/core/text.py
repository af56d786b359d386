"""Text for people: other users' text made inert for terminals, and short local times."""

from __future__ import annotations

import time
import unicodedata
from datetime import datetime
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


def format_time(epoch: int, now: float | None = None) -> str:
    """A short local time: '14:00' today, 'Tue 14:00' within a week, else '2026-12-01 14:00'."""
    moment = datetime.fromtimestamp(epoch).astimezone()
    today = datetime.fromtimestamp(now if now is not None else time.time()).astimezone().date()
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


def format_when(epoch: float, now: float) -> str:
    """A time and how far away it is: '19:00 (in 45 min)'."""
    return f"{format_time(int(epoch), now)} ({relative(epoch, now)})"


def format_duration(seconds: float) -> str:
    """'45m', '3h', '1h30m', '2d4h': the same forms the time parser reads."""
    minutes = max(0, int(seconds) // 60)
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "", f"{minutes}m" if minutes else ""]
    return "".join(parts) or "0m"


def format_cards(cards: Sequence[int]) -> str:
    return ",".join(str(c) for c in cards)


def cards_text(cards: Sequence[int]) -> str:
    """'card 4' or 'cards 0,1'."""
    return f"{'card' if len(cards) == 1 else 'cards'} {format_cards(cards)}"


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

"""The board summary pushed at `[notify] summary_at`: every card's VRAM, utilisation and holder, and what frees next.

Built from the `status` operation's document (app.service.fleet.status), so it says what `board status` says.
Times are wall-clock in the policy zone ([policy] timezone, else the service's), labelled with it in the
title: a push goes to the whole team, in whatever zones they are.
"""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo

from app.core.text import format_time, zone_name
from app.notify.formats import Message

GRACE_S = 3600  # a summary slot missed by less than this (the service was down) is still sent once


def zone(name: str | None) -> tzinfo | None:
    if not name:
        return None  # the service's own local time
    from zoneinfo import ZoneInfo  # start-up: only a named zone loads zoneinfo

    return ZoneInfo(name)


def due_slot(now: float, summary_at: tuple[str, ...], tz: tzinfo | None) -> int | None:
    """The latest summary time at or before `now`, if it is less than GRACE_S ago; as epoch seconds."""
    local = datetime.fromtimestamp(now, tz).astimezone(tz) if tz else datetime.fromtimestamp(now).astimezone()
    best = None
    for day in (local.date() - timedelta(days=1), local.date()):
        for text in summary_at:
            hours, minutes = (int(x) for x in text.split(":"))
            naive = datetime(day.year, day.month, day.day, hours, minutes)
            moment = naive.replace(tzinfo=tz) if tz else naive.astimezone()
            epoch = int(moment.timestamp())
            if epoch <= now and (best is None or epoch > best):
                best = epoch
    return best if best is not None and now - best < GRACE_S else None


def _gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f}"


def summary(status: dict, now: float, tz: tzinfo | None) -> Message:
    """The summary message for one `status` document."""
    cards = status["cards"]
    lines, free_now, frees = [], [], []
    for card in cards:
        booking, upcoming = card.get("booking"), card.get("next_booking")
        holder = booking["user"] if booking else (", ".join(card.get("users") or ()) or "nobody")
        util = card.get("utilization_pct")
        line = (f"GPU {card['index']}: {card['state']}, {_gib(card.get('memory_used_mib'))}/"
                f"{_gib(card.get('memory_total_mib'))} GiB, {'?' if util is None else util} % busy, {holder}")
        if booking:
            line += f" until {format_time(booking['end'], now, tz)}"
        if upcoming:
            line += f"; next {upcoming['user']} at {format_time(upcoming['start'], now, tz)}"
        lines.append(line)
        if card["state"] == "LOST":
            continue
        if card["state"] == "FREE":
            free_now.append(card["index"])
        elif booking:
            free_at = booking["end"]
            if upcoming and upcoming["start"] <= free_at:
                free_at = upcoming["end"]  # booked back to back: it frees after the next one
            frees.append((free_at, card["index"]))
    title = f"Board at {format_time(int(now), now, tz)} ({zone_name(tz)}): {len(free_now)} of {len(cards)} cards free"
    fields = [("Free now", ",".join(map(str, free_now)) or "none")]
    if frees:
        fields.append(("Free next", "; ".join(f"GPU {i} at {format_time(t, now, tz)}" for t, i in sorted(frees)[:4])))
    return Message("summary", int(now), title, tuple(lines), tuple(fields))

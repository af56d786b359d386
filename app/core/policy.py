"""Booking policy: the longest booking, how far ahead, cards per user, and per-pool classes and windows."""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo
from typing import Sequence

from app.config import CLASSES, Config, Pool
from app.core.identity import listed
from app.core.text import zone_name
from app.errors import NotPermitted


def may_use(config: Config, klass: str, user: str) -> bool:
    """Whether `user` may hold a `klass` booking or key: [classes] names them or one of their groups (@group), or does
    not name the class (everyone may)."""
    allowed = config.classes.get(klass)
    return allowed is None or listed(allowed, user)


def class_refusal(config: Config, klass: str, user: str) -> str | None:
    """Why `user` may not hold a `klass` booking or key (naming who may, and what they may use instead), or None."""
    if may_use(config, klass, user):
        return None
    who = ", ".join(config.classes[klass]) or "no one"
    others = [k for k in CLASSES if k != klass and may_use(config, k, user)]
    instead = f"use {' or '.join(others)}" if others else "no class is open to them; ask an admin"
    return f"{user} may not use class {klass}: it is for {who} ([classes] in the service's config); {instead}"


def card_refusal(config: Config, card: int, klass: str, start: int, end: int, tz: tzinfo | None = None,
                 project: str | None = None) -> str | None:
    """Why `card` may not carry a `klass` booking over [start, end), or None when it may. With `project`, another
    project's allocation of the card refuses it too."""
    if project is not None and config.projects:
        from app.core.projects import allocation_refusal  # start-up: only a board with projects

        if reason := allocation_refusal(config, project, (card,), start, end, tz or policy_zone(config)):
            return reason
    for pool in config.pools:
        if card not in pool.cards:
            continue
        if klass not in pool.classes:
            return f"class {klass} is not allowed on pool {pool.name} (cards {_cards(pool)})"
        if pool.max_hours is not None and end - start > pool.max_hours * 3600:
            return f"pool {pool.name} allows at most {pool.max_hours:g} h per booking"
        window = pool.windows.get(klass)
        if window and not _inside_window(window, start, end, zone := tz or policy_zone(config)):
            # Wall-clock hours of the policy zone, labelled: a member elsewhere reads them as such.
            hours = f"{_hhmm(window.start_minute)}-{_hhmm(window.end_minute)} ({zone_name(zone)})"
            weekends = " and at weekends" if window.weekends else ""
            return f"class {klass} is allowed on pool {pool.name} only {hours}{weekends}"
    return None


def check(
    config: Config,
    *,
    cards: Sequence[int],
    klass: str,
    start: int,
    end: int,
    now: int,
    held: Sequence[tuple[int, int, int]],
    tz: tzinfo | None = None,
    project: str | None = None,
) -> None:
    """Raise NotPermitted naming the first rule the booking breaks. `held`: the user's other live (start, end, n_cards).
    `project`: what it is for, whose allocations it may use."""
    check_span(config, start=start, end=end, now=now)
    policy = config.policy
    for card in cards:
        if reason := card_refusal(config, card, klass, start, end, tz, project):
            raise NotPermitted(f"card {card}: {reason}")
    peak = _peak_cards(held, start, end) + len(cards)
    if peak > policy.max_cards_per_user:
        raise NotPermitted(
            f"you would hold {peak} cards at once; the limit is {policy.max_cards_per_user}"
        )


def check_span(config: Config, *, start: int, end: int, now: int) -> None:
    """The rules no other start can satisfy: the longest booking, and how far ahead it may start."""
    policy = config.policy
    if end - start > policy.max_booking_hours * 3600:
        raise NotPermitted(f"a booking may last at most {policy.max_booking_hours:g} h; book a shorter slot")
    if start - now > policy.max_ahead_days * 86400:
        raise NotPermitted(f"a booking may start at most {policy.max_ahead_days:g} days ahead")


def window_opens(config: Config, klass: str, start: int, end: int, tz: tzinfo | None = None) -> list[int]:
    """The instants in [start, end) when some pool's window for `klass` opens (a weekend-wide window: each
    Saturday's midnight). Besides booking ends, these are the only starts where a refusal can turn into a yes."""
    windows = [w for pool in config.pools if (w := pool.windows.get(klass)) is not None]
    if not windows and not config.projects:
        return []
    tz = tz or policy_zone(config)
    found: set[int] = set()
    if config.projects:  # where an allocation ends, its cards come free for everyone else
        from app.core.projects import allocation_opens  # start-up: only a board with projects

        found.update(allocation_opens(config, start, end, tz))
    day = datetime.fromtimestamp(start, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    while day.timestamp() < end:
        for window in windows:
            found.add(int((day + timedelta(minutes=window.start_minute)).timestamp()))
            if window.weekends and day.weekday() == 5:
                found.add(int(day.timestamp()))
        day += timedelta(days=1)  # wall-clock arithmetic: midnight stays midnight across DST
    return sorted(t for t in found if start <= t < end)


def open_classes(pool: Pool, start: int, end: int, tz: tzinfo | None) -> tuple[str, ...]:
    """The classes `pool` takes for the whole of [start, end), its windows read in `tz` (None: local time): what
    the timeline's rules rows show, by the same rule that refuses a booking (card_refusal)."""
    return tuple(k for k in pool.classes if (w := pool.windows.get(k)) is None or _inside_window(w, start, end, tz))


def pool_rules(pool: Pool) -> str:
    """What a pool takes, in words: 'online, batch, finetune 19:00-09:00 and weekends' or 'any class, ≤12 h'."""
    parts = []
    for klass in pool.classes:
        window = pool.windows.get(klass)
        if window is None:
            parts.append(klass)
        else:
            weekends = " and weekends" if window.weekends else ""
            parts.append(f"{klass} {_hhmm(window.start_minute)}-{_hhmm(window.end_minute)}{weekends}")
    text = "any class" if set(pool.classes) == set(CLASSES) and not pool.windows else ", ".join(parts)
    if pool.max_hours is not None:
        text += f", ≤{pool.max_hours:g} h"
    return text


def _peak_cards(held: Sequence[tuple[int, int, int]], start: int, end: int) -> int:
    """The most cards the user holds at any moment inside [start, end)."""
    changes = []
    for s, e, n in held:
        if s < end and start < e:
            changes += [(max(s, start), n), (min(e, end), -n)]
    peak = current = 0
    for _, delta in sorted(changes, key=lambda change: (change[0], change[1])):
        current += delta
        peak = max(peak, current)
    return peak


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def policy_zone(config: Config) -> tzinfo | None:
    """The zone windows are evaluated in: [policy] timezone, else the system's (None: the process's local time)."""
    if not config.policy.timezone:
        return None
    from zoneinfo import ZoneInfo

    return ZoneInfo(config.policy.timezone)


def _inside_window(window, start: int, end: int, tz: tzinfo | None) -> bool:
    """True when every moment of [start, end) is inside the window (local time) or at a weekend."""
    # tz None: naive local wall time, so steps across a DST change keep the system zone's rules
    # (an aware local time from astimezone() has a fixed offset).
    t = datetime.fromtimestamp(start, tz)
    while t.timestamp() < end:  # instants: wall times repeat in the hour a clock goes back
        midnight = t.replace(hour=0, minute=0, second=0, microsecond=0)
        if window.weekends and t.weekday() >= 5:
            t = midnight + timedelta(days=1)
            continue
        minute = t.hour * 60 + t.minute
        s, e = window.start_minute, window.end_minute
        if s <= e:
            if not s <= minute < e:
                return False
            t = midnight + timedelta(minutes=e)
        elif minute >= s:
            t = midnight + timedelta(days=1, minutes=e)  # wraps past midnight
        elif minute < e:
            t = midnight + timedelta(minutes=e)
        else:
            return False
    return True


def _cards(pool: Pool) -> str:
    return ",".join(str(c) for c in pool.cards)

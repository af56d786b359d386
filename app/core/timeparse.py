"""Parse the time expressions of the CLI: starts, durations and ranges.

Standard library only. Every public function either returns or raises
``TimeInputError`` (a one-line ``ValueError``) for any string input.

Starts (case-insensitive):
    now | 14:00 | today 14:00 | tomorrow 9:00 | tomorrow | mon 9:00 | monday | tonight | this weekend |
    2026-12-01T14:00[:30][Z|+01:00] | 2026-12-01 14:00 | 2026-12-01 | +2h +90m +1h30m +2d
Ends (``parse_end``, for --until): the same forms, read the same way from now, except two that are
    read from the start: a bare time (``18:00``) is the first such time after the start, and ``+2h``
    is two hours after the start. An end at or before the start is an error that shows both.
Durations: 90m 3h 1h30m 2d 1d12h 1.5h (minute resolution; 0 < d <= 3650 days)
Ranges: 9-19 | 14:00-18:00 | today 9-17 | tomorrow 9-19 | mon 9:00-17:30 |
    2026-12-01T09:00-12:00

Rules:
* A bare time (``14:00``) is today, or tomorrow if it was more than a minute ago.
  A weekday is the next such day: today if the time is still ahead, else next week.
  ``today`` is taken literally (may be in the past; the caller decides).
* A day without a time (``tomorrow``, ``mon``, ``today``) means 09:00 that day.
  ``2026-12-01`` alone means midnight.
* ``tonight`` is today at the night start (``[booking] night_start``, 19:00), or now once that
  has passed. ``this weekend`` is Saturday 09:00, or now on a Saturday or Sunday.
* In a range the end may omit minutes; if the end hour is smaller than the start
  hour the range runs past midnight (``22-2`` = 22:00 to 02:00 next day; ``24``
  is accepted as an end meaning midnight). Otherwise end <= start is an error.
  Dated (ISO) ranges never wrap, so ``2026-12-01T14:00-05:00`` is not a range
  and ``parse_when_or_range`` reads it as a time with a -05:00 offset.
* ``+2h`` is elapsed time (UTC arithmetic); wall-clock forms are wall-clock.

Time zones: ``now`` is usually ``datetime.now().astimezone()``, whose tzinfo is
a *fixed* offset that is wrong across a DST change. So wall-clock times are
resolved like this:
* ``now`` has a real zone (e.g. ZoneInfo): use it.
* ``now`` has a fixed offset that agrees with the system zone (TZ env) at ``now``:
  resolve through the system zone (``naive.astimezone()``, i.e. mktime), so
  ``tomorrow 9:00`` stays 09:00 local even if the offset changes overnight.
  The result then carries that day's offset.
* otherwise the fixed offset is taken as the zone itself.
A wall time the clocks skip (the spring-forward gap, 02:30 on a night they go from 02:00 to
03:00) is refused: nobody means an instant that never shows on a clock. One they show twice (the
autumn hour) is its first occurrence, and a caller that passes `notes` gets a line saying so and
how to write the second (``2027-10-31T02:30+01:00``); an explicit offset is never ambiguous.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone

__all__ = [
    "TimeInputError",
    "parse_when",
    "parse_end",
    "parse_duration",
    "parse_range",
    "parse_when_or_range",
]

START_FORMS = "now, 14:00, tomorrow 9:00, mon 9:00, tonight, this weekend, 2026-12-01T14:00 or +2h"
END_FORMS = "18:00 (the first after the start), +2h (after the start), tomorrow 18:00, fri 12:00 or 2026-12-01T18:00"
DURATION_FORMS = "90m, 3h, 1h30m, 1.5h, 2d or 1d12h"
RANGE_FORMS = "14:00-18:00, tomorrow 9-19, mon 9:00-17:30, 22-2 or 2026-12-01T09:00-12:00"

MAX_MINUTES = 3650 * 24 * 60
GRACE = timedelta(minutes=1)
DEFAULT_HOUR = 9  # `tomorrow` / `mon` alone, and Saturday's hour for `this weekend`
NIGHT_START = 19 * 60  # `tonight`, in minutes after midnight: [booking] night_start
NightStart = int | Callable[[], int]  # the minutes, or a function that reads them from the config when needed

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")

_HM = r"(\d{1,2}):(\d{2})"
_BARE_TIME = re.compile(_HM)
_H_OPT_M = r"(\d{1,2})(?::(\d{2}))?"
_DATE = r"(\d{4})-(\d{1,2})-(\d{1,2})"
_WORD_TIME = re.compile(rf"(?:([a-z]+)(?:\s+{_HM})?|{_HM})")
_ISO = re.compile(rf"{_DATE}(?:[t ]\s*{_HM}(?::(\d{{2}}))?\s*(z|[+-]\d{{2}}:?\d{{2}})?)?")
_NUM = r"(\d+(?:\.\d*)?|\.\d+)\s*"
_DUR = re.compile(
    rf"(?:{_NUM}d(?:ays?)?)?\s*(?:{_NUM}h(?:rs?|ours?)?)?\s*(?:{_NUM}m(?:ins?|inutes?)?)?"
)
_RANGE = re.compile(
    rf"(?:([a-z]+)\s+|{_DATE}(?:t|\s)\s*)?{_H_OPT_M}\s*[-\u2013]\s*{_H_OPT_M}"
)


class TimeInputError(ValueError):
    """Bad time input; ``str(e)`` is one line: the problem and the accepted forms."""


def _err(text: object, what: str, forms: str) -> TimeInputError:
    shown = str(text).strip()
    shown = shown if len(shown) <= 40 else shown[:40] + "..."
    return TimeInputError(f"can't read {shown!r} as {what}; use {forms}")


# ---------------------------------------------------------------- zones


def _zone_mode(now: datetime) -> str:
    if not isinstance(now.tzinfo, timezone):
        return "zone"
    return "system" if now.astimezone().utcoffset() == now.utcoffset() else "fixed"


def _to_local(dt: datetime, now: datetime) -> datetime:
    """An aware instant expressed in now's (local) zone."""
    return dt.astimezone() if _zone_mode(now) == "system" else dt.astimezone(now.tzinfo)


Notes = list  # lines for the person who typed the time (an ambiguous wall time), or None: nobody asks


def _resolve(naive: datetime, now: datetime) -> datetime:
    """The instant `naive` (a wall time, its fold saying which of two) names in now's zone, as a local time there."""
    if _zone_mode(now) == "system":
        return naive.astimezone()
    return naive.replace(tzinfo=now.tzinfo).astimezone(timezone.utc).astimezone(now.tzinfo)


def _wall(d: date, h: int, m: int, s: int, now: datetime, notes: Notes | None = None, *, strict: bool = True) -> datetime:
    """Wall-clock time h:m:s on day d in now's (local) zone, DST-correct.

    A time the clocks skip is TimeInputError, unless not `strict` (a candidate to compare, not the answer:
    then the instant after the gap). A time they show twice is the first; `notes` gets a line saying so."""
    naive = datetime(d.year, d.month, d.day, h, m, s)
    plain = _resolve(naive, now)
    try:
        other = _resolve(naive.replace(fold=1), now)
    except (OverflowError, ValueError):  # the system zone's fold=1 looks a day past 9999-12-31: no DST there
        other = plain
    first, second = sorted((plain, other), key=datetime.timestamp)
    if naive not in (first.replace(tzinfo=None), second.replace(tzinfo=None)):  # in a gap: neither shows it
        if strict:
            raise _skipped(naive, first, second, now)
        return second
    if notes is not None and first.timestamp() != second.timestamp():
        notes.append(f"{naive:%H:%M} happens twice on {naive:%a %d %b %Y} (the clocks go back); took the first"
                     f" ({first:%Z}, UTC{_offset(first)}); write {naive:%Y-%m-%dT%H:%M}{_offset(second)} for the second")
    return first


def _offset(moment: datetime) -> str:
    """'+02:00': the offset as --start reads it after a time."""
    offset = moment.utcoffset()
    assert offset is not None  # `moment` is aware: _wall's instants are
    minutes = int(offset.total_seconds()) // 60
    return f"{'-' if minutes < 0 else '+'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _skipped(naive: datetime, early: datetime, late: datetime, now: datetime) -> TimeInputError:
    """The refusal of a wall time in a gap: when the clocks jump, from what to what, and what to give instead.
    `early` and `late` are the instants the time would name with the offset after and before the jump."""
    lo, hi = int(early.timestamp()), int(late.timestamp())  # the jump is in (lo, hi]: find its second
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _resolve_epoch(mid, now).utcoffset() == early.utcoffset():
            lo = mid
        else:
            hi = mid
    before, after = _resolve_epoch(lo, now), _resolve_epoch(hi, now)
    jump_from, jump_to = (before + timedelta(seconds=1)).replace(tzinfo=None), after.replace(tzinfo=None)
    return TimeInputError(
        f"{naive:%H:%M} does not exist on {naive:%a %d %b %Y}: the clocks go forward from {jump_from:%H:%M}"
        f" ({before:%Z}) to {jump_to:%H:%M} ({after:%Z}); give a time before {jump_from:%H:%M} or from"
        f" {jump_to:%H:%M} on")


def _resolve_epoch(epoch: int, now: datetime) -> datetime:
    moment = datetime.fromtimestamp(epoch, timezone.utc)
    return moment.astimezone() if _zone_mode(now) == "system" else moment.astimezone(now.tzinfo)


# ---------------------------------------------------------------- pieces


def _hm(h: str, m: str | None, *, allow_24: bool = False) -> tuple[int, int]:
    hh, mm = int(h), int(m or 0)
    if allow_24 and (hh, mm) == (24, 0):
        return 24, 0
    if hh > 23 or mm > 59:
        raise TimeInputError(f"no such time of day {h}:{m or '00'}; hours are 0-23, minutes 0-59, e.g. 14:00")
    return hh, mm


def _day_word(word: str, now: datetime) -> tuple[date, int | None]:
    """(date, weekday-or-None) for today/tomorrow/weekday names; weekday days are resolved later."""
    today = now.date()
    if word == "today":
        return today, None
    if word in ("tomorrow", "tmrw", "tmr"):
        return today + timedelta(days=1), None
    if len(word) >= 3:
        for i, name in enumerate(_WEEKDAYS):
            if name.startswith(word):
                return today + timedelta(days=(i - today.weekday()) % 7), i
    raise KeyError(word)


def _on_day(word: str | None, h: int, m: int, now: datetime, notes: Notes | None = None) -> datetime:
    """Resolve `[word] h:m` with the roll-forward rules (a day passed over may lack the time: no matter)."""
    if word is None:  # bare time: today, else tomorrow
        day = now.date()
        if _wall(day, h, m, 0, now, strict=False) < now - GRACE:
            day += timedelta(days=1)
        return _wall(day, h, m, 0, now, notes)
    d, weekday = _day_word(word, now)
    if weekday is not None and _wall(d, h, m, 0, now, strict=False) < now - GRACE:
        d += timedelta(days=7)
    return _wall(d, h, m, 0, now, notes)


def _duration_minutes(text: str) -> int:
    t = text.strip().lower()
    m = _DUR.fullmatch(t)
    if not t or not m or not any(m.groups()):
        if re.fullmatch(r"[\d.]+\s*s(ec(ond)?s?)?", t):
            raise TimeInputError(f"{t!r}: seconds are not supported, minutes are the finest; use {DURATION_FORMS}")
        raise _err(text, "a duration", DURATION_FORMS)
    d, h, mins = (float(g) if g else 0.0 for g in m.groups())
    total = d * 1440 + h * 60 + mins
    if total > MAX_MINUTES:
        raise TimeInputError(f"duration {text.strip()!r} is too long; at most 3650 days")
    minutes = round(total)
    if minutes <= 0:
        raise TimeInputError(f"duration {text.strip()!r} must be at least one minute; use {DURATION_FORMS}")
    return minutes


def _guard(forms: str):
    """Map stray ValueError/OverflowError/OSError (bad dates, year-9999 overflow) to TimeInputError."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(text, *args, **kwargs):
            if not isinstance(text, str):
                raise TimeInputError(f"expected text, got {type(text).__name__}; use {forms}")
            try:
                return fn(text, *args, **kwargs)
            except TimeInputError:
                raise
            except (ValueError, OverflowError, OSError) as e:
                msg = f"can't use {text.strip()[:40]!r}: {e}; use {forms}"
                raise TimeInputError(" ".join(msg.split())) from None

        return wrapper

    return deco


def _aware(now: datetime) -> datetime:
    return now if now.tzinfo is not None else now.astimezone()


# ---------------------------------------------------------------- API


@_guard(DURATION_FORMS)
def parse_duration(text: str) -> timedelta:
    """`90m`, `3h`, `1h30m`, `1.5h`, `2d`, `1d12h` -> timedelta (whole minutes, > 0, <= 3650 days)."""
    return timedelta(minutes=_duration_minutes(text))


@_guard(START_FORMS)
def parse_when(text: str, now: datetime, *, night_start: NightStart = NIGHT_START, notes: Notes | None = None) -> datetime:
    """A start time (see module docstring) as an aware datetime in now's local zone.

    `night_start` (minutes after midnight, or a function giving them) is asked only for `tonight`,
    so a caller can leave the config unread until someone says it. `notes` gets a line for a wall time
    the clocks show twice (which one was taken)."""
    now = _aware(now)
    t = " ".join(text.strip().lower().split())
    if t == "now":
        return now
    if t == "tonight":
        minute = night_start() if callable(night_start) else night_start
        return max(now, _wall(now.date(), minute // 60, minute % 60, 0, now, notes))
    if t == "this weekend":
        if now.weekday() >= 5:
            return now
        return _wall(now.date() + timedelta(days=5 - now.weekday()), DEFAULT_HOUR, 0, 0, now, notes)
    if t.startswith("+"):
        try:
            delta = timedelta(minutes=_duration_minutes(t[1:]))
        except TimeInputError as e:
            if str(e).startswith("can't read"):
                raise _err(text, "a time", START_FORMS) from None
            raise
        return _to_local(now.astimezone(timezone.utc) + delta, now)
    if m := _ISO.fullmatch(t):
        y, mo, d, hh, mm, ss, off = m.groups()
        day = date(int(y), int(mo), int(d))
        h, mi = _hm(hh, mm) if hh else (0, 0)
        if off is None:
            return _wall(day, h, mi, int(ss or 0), now, notes)
        if off == "z":
            tz = timezone.utc
        else:
            sign = -1 if off[0] == "-" else 1
            oh, om = int(off[1:3]), int(off[-2:])
            tz = timezone(sign * timedelta(hours=oh, minutes=om))
        return _to_local(datetime(day.year, day.month, day.day, h, mi, int(ss or 0), tzinfo=tz), now)
    if m := _WORD_TIME.fullmatch(t):
        word, h1, m1, h2, m2 = m.groups()
        h, mi = (DEFAULT_HOUR, 0) if word and h1 is None else _hm(h1 or h2, m1 or m2)
        try:
            return _on_day(word, h, mi, now, notes)
        except KeyError:
            pass
    raise _err(text, "a time", START_FORMS)


def _shown(moment: datetime) -> str:
    """'Mon 30 Nov 14:00': a time in a message, with its day, since the point is often the day."""
    return moment.strftime("%a %d %b %H:%M")


@_guard(END_FORMS)
def parse_end(text: str, start: datetime, now: datetime, *, night_start: NightStart = NIGHT_START,
              after: str = "the start", notes: Notes | None = None) -> datetime:
    """An end for `start` (see module docstring); `after` names the start in the message (`extend`: the current end)."""
    now = _aware(now)
    start = _to_local(_aware(start), now)
    t = " ".join(text.strip().lower().split())
    if m := _BARE_TIME.fullmatch(t):
        h, mi = _hm(*m.groups())
        day = start.date()
        if _wall(day, h, mi, 0, now, strict=False) <= start:
            day += timedelta(days=1)
        end = _wall(day, h, mi, 0, now, notes)
    elif t.startswith("+"):
        try:
            delta = timedelta(minutes=_duration_minutes(t[1:]))
        except TimeInputError as e:
            if str(e).startswith("can't read"):
                raise _err(text, "an end", END_FORMS) from None
            raise
        end = _to_local(start.astimezone(timezone.utc) + delta, now)
    else:
        try:
            end = parse_when(text, now, night_start=night_start, notes=notes)
        except TimeInputError as e:
            if str(e).startswith("can't read"):
                raise _err(text, "an end", END_FORMS) from None
            raise
    if end <= start:
        raise TimeInputError(f"the end {_shown(end)} is at or before {after} {_shown(start)}; give a later end, such as +2h")
    return end


def _range(text: str, now: datetime, notes: Notes | None = None) -> tuple[datetime, datetime] | None:
    """None if text isn't range-shaped; else the range or TimeInputError."""
    t = " ".join(text.strip().lower().split())
    m = _RANGE.fullmatch(t)
    if not m:
        return None
    word, y, mo, d, h1, m1, h2, m2 = m.groups()
    sh, sm = _hm(h1, m1)
    eh, em = _hm(h2, m2, allow_24=True)
    if y:
        start = _wall(date(int(y), int(mo), int(d)), sh, sm, 0, now, notes)
    else:
        try:
            start = _on_day(word, sh, sm, now, notes)
        except KeyError:
            raise _err(text, "a time range", RANGE_FORMS) from None
    wraps = eh == 24 or (eh < sh and not y)
    if not wraps and (eh, em) <= (sh, sm):
        raise TimeInputError(
            f"range {text.strip()!r} ends at or before it starts"
            + ("" if y else "; an end hour smaller than the start hour runs past midnight, e.g. 22-2")
        )
    end_day = start.date() + timedelta(days=1) if wraps else start.date()
    return start, _wall(end_day, eh % 24, em, 0, now, notes)


@_guard(RANGE_FORMS)
def parse_range(text: str, now: datetime, *, notes: Notes | None = None) -> tuple[datetime, datetime]:
    """A range (see module docstring) -> (start, end), end > start, aware in now's local zone."""
    r = _range(text, _aware(now), notes)
    if r is None:
        raise _err(text, "a time range", RANGE_FORMS)
    return r


@_guard(f"{START_FORMS}; or a range like {RANGE_FORMS}")
def parse_when_or_range(text: str, now: datetime, *, night_start: NightStart = NIGHT_START,
                        notes: Notes | None = None) -> tuple[datetime, datetime | None]:
    """A range -> (start, end); otherwise a start -> (start, None). For --start."""
    now = _aware(now)
    said: Notes = []  # a range's notes count only if it is read as a range
    try:
        r = _range(text, now, said)
    except TimeInputError:
        if not _ISO.fullmatch(" ".join(text.lower().split())):  # ISO: maybe a negative offset
            raise
        r = None
    if r is not None:
        if notes is not None:
            notes.extend(said)
        return r
    try:
        return parse_when(text, now, night_start=night_start, notes=notes), None
    except TimeInputError as e:
        if str(e).startswith("can't read"):
            raise _err(text, "a time or range", f"{START_FORMS}; or a range like {RANGE_FORMS}") from None
        raise

"""Standing slots: a rule (which days, what clock times, from which date to which) and its occurrences.

Pure: a rule expands to (start, end) pairs of UTC epoch seconds in a zone the caller gives, and
nothing here reads the clock, the config or the database. Times are wall-clock in that zone, so a
09:00-19:00 slot stays 09:00-19:00 across a DST change (the hours between may be 9 or 11 on the
nights the clocks change). An `until` at or before `start` ends the next morning: 19:00-07:00 is a
night. The dates are inclusive and name the day each occurrence starts on.

`every` is one of:
    day | weekday (Mon-Fri) | weekend (Sat, Sun) | week (the weekday of the first date) |
    a list of weekdays such as mon,wed,fri (names or their first three letters)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, tzinfo
from typing import Any

from app.core.text import inert
from app.errors import BadInput

EVERY_FORMS = "day, weekday, weekend, week, or days such as mon,wed,fri"
MAX_SPAN_DAYS = 366  # from the first date to the last: a year at a time, extended later if need be
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FULL = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WORDS = {"day": ("day", tuple(range(7))), "daily": ("day", tuple(range(7))),
          "weekday": ("weekday", tuple(range(5))), "weekdays": ("weekday", tuple(range(5))),
          "weekend": ("weekend", (5, 6)), "weekends": ("weekend", (5, 6))}
_CLOCK = re.compile(r"(\d{1,2})(?::(\d{2}))?")
_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


@dataclass(frozen=True, slots=True)
class Rule:
    """What a series asked for. `days` are weekdays (0 is Monday); minutes are after midnight."""

    every: str  # as normalised for people: "weekday", "mon,wed,fri", "week"
    days: tuple[int, ...]
    start_minute: int
    until_minute: int
    first: date
    last: date

    @property
    def overnight(self) -> bool:
        return self.until_minute <= self.start_minute

    def to_json(self) -> dict[str, Any]:
        return {"every": self.every, "days": list(self.days), "start": _hhmm(self.start_minute),
                "until": _hhmm(self.until_minute), "from": self.first.isoformat(), "to": self.last.isoformat()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rule:
        """The rule a series row stored (written by to_json); ValueError when it was edited into nonsense."""
        days = tuple(int(d) for d in data["days"])
        if not days or any(not 0 <= d <= 6 for d in days):
            raise ValueError(f"days {days!r} are not weekdays 0-6")
        return cls(str(data["every"]), days, parse_clock(data["start"], "start"), parse_clock(data["until"], "until"),
                   parse_date(data["from"], "from"), parse_date(data["to"], "to"))

    def with_dates(self, first: date, last: date) -> Rule:
        return Rule(self.every, self.days, self.start_minute, self.until_minute, first, last)


def make_rule(every: str, start: str, until: str, first: date, last: date) -> Rule:
    """A checked rule; BadInput (one line) for an unknown `every`, an unreadable time, `last` before `first`,
    a span over MAX_SPAN_DAYS, or an `until` equal to `start`."""
    if last < first:
        raise BadInput(f"--to {last.isoformat()} is before --from {first.isoformat()}; the dates are the first"
                       " and last days of the series")
    if (last - first).days > MAX_SPAN_DAYS:
        raise BadInput(f"--from {first.isoformat()} to --to {last.isoformat()} is {(last - first).days} days;"
                       f" a series spans at most {MAX_SPAN_DAYS} days (extend it later with 'board series extend')")
    start_minute, until_minute = parse_clock(start, "--start"), parse_clock(until, "--until")
    if start_minute == until_minute:
        raise BadInput(f"--until {_hhmm(until_minute)} is the same time as --start; give the time each occurrence"
                       " ends, such as --start 9:00 --until 19:00 (or 19:00 to 07:00 for a night)")
    every, days = parse_every(every, first)
    return Rule(every, days, start_minute, until_minute, first, last)


def parse_every(text: str, first: date) -> tuple[str, tuple[int, ...]]:
    """(the word as stored, the weekdays): `week` repeats on the weekday of `first`."""
    word = " ".join(str(text).lower().split())
    if word in _WORDS:
        return _WORDS[word]
    if word in ("week", "weekly"):
        return "week", (first.weekday(),)
    days: set[int] = set()
    for part in word.split(","):
        name = part.strip()
        found = [i for i, full in enumerate(_FULL) if len(name) >= 3 and full.startswith(name)]
        if not found:
            raise BadInput(f"can't read --every {inert(str(text).strip(), 40)!r}; use {EVERY_FORMS}")
        days.add(found[0])
    ordered = tuple(sorted(days))
    return ",".join(WEEKDAYS[d] for d in ordered), ordered


def parse_clock(text: str, what: str) -> int:
    """'9', '9:00', '19:30' or '24:00' (midnight) -> minutes after midnight; BadInput for anything else."""
    found = _CLOCK.fullmatch(str(text).strip())
    if found is not None:
        hours, minutes = int(found[1]), int(found[2] or 0)
        if (hours, minutes) == (24, 0):
            return 0
        if hours <= 23 and minutes <= 59:
            return hours * 60 + minutes
    raise BadInput(f"can't read {what} {inert(str(text).strip(), 40)!r} as a time of day; with --every, give clock"
                   " times such as --start 9:00 --until 19:00")


def parse_date(text: str, what: str) -> date:
    """'2026-12-07' -> the date; BadInput for anything else, a day before 1970 or after 8999 included."""
    found = _DATE.fullmatch(str(text).strip())
    try:
        if found is None:
            raise ValueError("not YYYY-MM-DD")
        return _in_reach(date(int(found[1]), int(found[2]), int(found[3])))
    except ValueError:
        raise BadInput(f"can't read {what} {inert(str(text).strip(), 40)!r} as a date; give a day such as"
                       " 2026-12-07") from None


def _in_reach(day: date) -> date:
    """The service's times run from 1970 to 9000 (app.service.ops.registry.Time): a series' days, a day on and a time
    zone away, stay dates Python can hold (its last year is 9999)."""
    if not 1970 <= day.year < 9000:
        raise ValueError
    return day


def occurrences(rule: Rule, tz: tzinfo | None) -> list[tuple[int, int]]:
    """Each (start, end) the rule makes, in order: one per matching day from `first` to `last`.

    `tz` is the zone the clock times are read in; None is the process's local time, whose rules
    (not a fixed offset) apply on each day. A time the clocks skip (02:30 on the spring-forward
    night) moves forward by the gap, as elsewhere in board."""
    found = []
    day = rule.first
    while day <= rule.last:
        if day.weekday() in rule.days:
            start = wall(day, rule.start_minute, tz)
            end = wall(day + timedelta(days=1) if rule.overnight else day, rule.until_minute, tz)
            found.append((start, end))
        day += timedelta(days=1)
    return found


def wall(day: date, minute: int, tz: tzinfo | None) -> int:
    """Epoch seconds of the wall-clock `minute` after midnight on `day` in `tz` (None: local time)."""
    moment = datetime.combine(day, time(minute // 60, minute % 60), tzinfo=tz)
    return int(moment.timestamp())


def local_date(epoch: int, tz: tzinfo | None) -> date:
    return datetime.fromtimestamp(epoch, tz).date()


def describe(rule: dict[str, Any]) -> str:
    """'every weekday 09:00-19:00, 2026-12-07 to 2027-03-31' from a stored rule (its JSON)."""
    every = rule.get("every", "?")
    if every == "week":
        every = f"week ({_FULL[rule['days'][0]].capitalize()})" if rule.get("days") else "week"
    start, until = rule.get("start"), rule.get("until")
    night = " (next day)" if isinstance(start, str) and isinstance(until, str) and until <= start else ""
    return f"every {every} {start or '?'}-{until or '?'}{night}, {rule.get('from', '?')} to {rule.get('to', '?')}"


def _hhmm(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"

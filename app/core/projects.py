"""Projects ([[projects]]): who books for which project, what it may use, its allocations and its budget period.

A config without [[projects]] has one implicit project, IMPLICIT, that every member books for with every class:
nothing here refuses anything then. The rules that need the store (a budget's use) live in app.service.rules.
"""

from __future__ import annotations

from datetime import datetime, timedelta, tzinfo
from typing import Iterable, NamedTuple, Sequence

from app.config import Config, Project, ProjectAllocation, parse_days, parse_hours
from app.core.identity import listed
from app.core.text import zone_name
from app.errors import BadInput, NotPermitted
from app.model import Booking

IMPLICIT = ""  # the project of every booking, key and usage record on a board without [[projects]]


def named(config: Config, name: str) -> Project | None:
    return next((p for p in config.projects if p.name == name), None)


def of(config: Config, user: str) -> tuple[Project, ...]:
    """The projects `user` is a member of (by name or through a group), in the config's order."""
    return tuple(p for p in config.projects if listed(p.members, user))


def choose(config: Config, user: str, asked: str | None) -> str:
    """The project `user` books (or makes a key, plans a server) for: `asked` (--project), or their only project.

    Raises BadInput for a project that does not exist or a choice left open, NotPermitted for one they are not in."""
    if not config.projects:
        if asked:
            raise BadInput(f"this board has no projects, so there is no project {_shown(asked)}; leave out --project")
        return IMPLICIT
    mine = of(config, user)
    if asked:
        project = named(config, asked)
        if project is None:
            raise BadInput(f"no project {_shown(asked)}; the projects are {', '.join(p.name for p in config.projects)}"
                           " ('board projects' shows them)")
        if project not in mine:
            raise NotPermitted(f"{user} is not a member of project {project.name}"
                               f" (members: {', '.join(project.members)}); {_theirs(mine)}")
        return project.name
    if not mine:
        raise NotPermitted(f"{user} is in no project; ask an admin to add them to one ([[projects]] members)")
    if len(mine) > 1:
        raise BadInput(f"{user} is in projects {', '.join(p.name for p in mine)}; pick one with --project")
    return mine[0].name


def _theirs(mine: Sequence[Project]) -> str:
    if not mine:
        return "ask an admin to add them to one ([[projects]] members)"
    return f"their projects: {', '.join(p.name for p in mine)}"


def _shown(name: str) -> str:
    return repr(name[:40])


def class_refusal(config: Config, project: str, klass: str) -> str | None:
    """Why a `klass` booking or key may not be for `project` (naming the projects that may), or None."""
    found = named(config, project)
    if found is None or klass in found.classes:
        return None
    may = [p.name for p in config.projects if klass in p.classes]
    who = f"{'project' if len(may) == 1 else 'projects'} {', '.join(may)} may" if may else "no project may"
    return (f"project {found.name} may not use class {klass} ({who}); its classes are {', '.join(found.classes)}")


def allocation_cards(config: Config, allocation: ProjectAllocation) -> tuple[int, ...]:
    if allocation.pool is not None:
        return next((p.cards for p in config.pools if p.name == allocation.pool), ())
    return allocation.cards


class Held(NamedTuple):
    """One window of a project's allocation: its cards are the project's over [start, end)."""

    project: str
    cards: tuple[int, ...]
    start: int
    end: int
    allocation: ProjectAllocation

    def words(self, tz: tzinfo | None) -> str:
        """"project A's allocation (mon-fri 09:00-19:00 Europe/Berlin)": its hours are the policy zone's."""
        return f"project {self.project}'s allocation ({self.allocation.days} {self.allocation.hours} {zone_name(tz)})"


def allocation_spans(config: Config, start: int, end: int, tz: tzinfo | None) -> list[Held]:
    """Each allocation window that meets [start, end), by start."""
    found = []
    for project in config.projects:
        for allocation in project.allocations:
            cards = allocation_cards(config, allocation)
            first, last = parse_hours(allocation.hours)
            days = parse_days(allocation.days)
            length = (last - first) % 1440 or 1440
            # A window that starts the day before `start` may still be open at it.
            day = datetime.fromtimestamp(start, tz).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
            while True:
                opens = _at(day, first)
                if opens >= end:
                    break
                if day.weekday() in days:
                    closes = _at(day, first + length)
                    if closes > start:
                        found.append(Held(project.name, cards, opens, closes, allocation))
                day += timedelta(days=1)  # wall-clock arithmetic: the next local midnight, DST or not
    return sorted(found, key=lambda held: (held.start, held.project))


def _at(day: datetime, minute: int) -> int:
    """Epoch seconds of `minute` past the local midnight `day` (wall-clock: a DST day is 23 or 25 hours)."""
    extra, minute = divmod(minute, 1440)
    return int((day + timedelta(days=extra)).replace(hour=minute // 60, minute=minute % 60).timestamp())


def allocation_refusal(config: Config, project: str, cards: Iterable[int], start: int, end: int,
                       tz: tzinfo | None) -> str | None:
    """Why a booking for `project` may not hold `cards` over [start, end): another project's allocation, or None.
    Of one card, it does not name the card (policy.card_refusal's caller does)."""
    if not config.projects:
        return None
    wanted = set(cards)
    for held in allocation_spans(config, start, end, tz):
        if held.project != project and (taken := sorted(wanted & set(held.cards))):
            which = "" if len(wanted) == 1 else f"cards {','.join(map(str, taken))} are "
            return f"{which}{held.words(tz)}; pick other cards or a time outside it"
    return None


def allocation_opens(config: Config, start: int, end: int, tz: tzinfo | None) -> list[int]:
    """Where an allocation window closes within [start, end): a start a search tries, as cards come free there."""
    return sorted({held.end for held in allocation_spans(config, start, end, tz) if start < held.end < end})


def period(project: Project, now: float, tz: tzinfo | None) -> tuple[int, int]:
    """The budget period holding `now`: (its start, its reset), local midnights of the policy zone; a week starts on
    Monday, a month on the 1st."""
    today = datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    if project.period == "week":
        first = today - timedelta(days=today.weekday())
        after = first + timedelta(days=7)
    else:
        first = today.replace(day=1)
        after = (first + timedelta(days=32)).replace(day=1)
    return int(first.timestamp()), int(after.timestamp())  # naive: the system's zone, as policy_zone's None means


def day(now: float, tz: tzinfo | None) -> tuple[int, int]:
    """The day holding `now`: (its local midnight, the next one) in the policy zone; a token budget's day (23 or 25
    hours across a DST change)."""
    today = datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    return int(today.timestamp()), int((today + timedelta(days=1)).timestamp())


def resets(project: Project, start: int, end: int, tz: tzinfo | None) -> list[int]:
    """Where `project`'s budget periods start again within (start, end]."""
    found = []
    at = period(project, start, tz)[1]
    while at <= end:
        found.append(at)
        at = period(project, at, tz)[1]
    return found


def card_seconds(bookings: Iterable[Booking], start: int, end: int) -> int:
    """Booked card-seconds of `bookings` within [start, end): what the calendar holds, cancelled bookings left out."""
    total = 0
    for booking in bookings:
        if booking.status != "booked":
            continue
        overlap = min(booking.end, end) - max(booking.start, start)
        if overlap > 0:
            total += overlap * len(booking.cards)
    return total


def spent(bookings: Iterable[Booking], project: str, start: int, reset: int, now: float) -> tuple[int, int]:
    """`project`'s booked card-seconds in the period [start, reset): (used, before `now`; ahead, from `now` on).
    `bookings` may hold other projects' and cancelled ones: they count for nothing."""
    theirs = [b for b in bookings if b.project == project]
    return card_seconds(theirs, start, min(int(now), reset)), card_seconds(theirs, max(int(now), start), reset)

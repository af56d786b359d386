"""The `projects` operation (any member): each [[projects]] entry with what it has (members, classes, allocations,
budget and limits) and what it spends (booked card-hours this period, tokens today). The board is a team tool, so
every member sees every project; `mine` says which are the caller's. The rules are app.core.projects."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from app.core import projects
from app.core.identity import Identity
from app.core.policy import policy_zone
from app.core.text import zone_name
from app.service.ops.registry import NoArguments, op
from app.store import bookings as rows
from app.store import keys as key_rows

if TYPE_CHECKING:
    from app.service import Service

NO_PROJECTS = "this board has no projects: every member books for one implicit project ([[projects]] adds them)"


class AllocationWire(TypedDict):
    cards: list[int]  # a pool's cards where it names a pool
    pool: str | None
    hours: str  # local hours of the policy zone, "09:00-19:00"
    days: str  # "mon-fri"


class ProjectWire(TypedDict):
    name: str
    members: list[str]  # user names and @groups, as the config lists them
    classes: list[str]
    allocations: list[AllocationWire]
    gpu_hours: float | None  # the budget per period; None: none
    period: str  # month | week
    period_start: int
    resets_at: int
    used_hours: float  # booked card-hours from the period's start to now
    booked_hours: float  # booked card-hours from now to the reset
    remaining_hours: float | None  # the budget less both (below 0 where an admin forced past it); None: no budget
    tokens_per_day: int | None
    tokens_today: int  # through the gateway since local midnight (the policy zone)
    rpm: int | None
    tpm: int | None
    share: float
    mine: bool  # the caller is a member


class ProjectsReply(TypedDict):
    now: int
    zone: str  # the policy zone: the allocations' hours, the periods' and the day's midnights are its
    projects: list[ProjectWire]
    note: str | None  # on a board without projects, the line that says so


@op("projects", NoArguments)
def projects_reply(service: Service, me: Identity, request: NoArguments) -> ProjectsReply:
    """Every project, in the config's order, with its use of this period's budget and of today's tokens."""
    config, now = service.config, int(service.clock())
    tz = policy_zone(config)
    if not config.projects:
        return {"now": now, "zone": zone_name(tz), "projects": [], "note": NO_PROJECTS}
    periods = {p.name: projects.period(p, now, tz) for p in config.projects}
    # One read over every project's period
    booked = rows.live_between(service.conn, min(s for s, _ in periods.values()), max(r for _, r in periods.values()))
    tokens = key_rows.tokens_by_project(service.conn, projects.day(now, tz)[0])
    found: list[ProjectWire] = []
    for project in config.projects:
        start, reset = periods[project.name]
        used, ahead = projects.spent(booked, project.name, start, reset, now)
        found.append({
            "name": project.name, "members": list(project.members), "classes": list(project.classes),
            "allocations": [{"cards": list(projects.allocation_cards(config, a)), "pool": a.pool, "hours": a.hours,
                             "days": a.days} for a in project.allocations],
            "gpu_hours": project.gpu_hours, "period": project.period, "period_start": start, "resets_at": reset,
            "used_hours": _hours(used), "booked_hours": _hours(ahead),
            "remaining_hours": None if project.gpu_hours is None else round(project.gpu_hours - _hours(used + ahead), 2),
            "tokens_per_day": project.tokens_per_day, "tokens_today": tokens.get(project.name, 0),
            "rpm": project.rpm, "tpm": project.tpm, "share": project.share,
            "mine": project in projects.of(config, me.name),
        })
    return {"now": now, "zone": zone_name(tz), "projects": found, "note": None}


def _hours(card_seconds: int) -> float:
    return round(card_seconds / 3600, 2)

"""An alias belongs to its holder: the check `serve start`, the runner's start of a plan and `serve plan` make.

The gateway routes a request to the servers whose alias is its `model`, so a second member's server under an alias
would receive the first member's traffic (their prompts in its log, its answers to their clients). So the servers
under one alias have one holder while they overlap: a member's live server holds its alias until its booking ends,
and a planned server for each of its occurrences' whole time (whether its server runs or not). A start or a plan
that would overlap another member's is refused (Conflict), naming the holder and the booking.

Where a clash arose later (a booking extended, a series grown), the earlier holder wins: a live server is never
displaced, and between plans the older one (the smaller id) holds; the runner's later start is refused and the
reason recorded on the plan's run. Team aliases ([gateway.team_aliases]) are served together by the users and
@groups listed there, and by no one else (NotPermitted). A catalog alias ([[models]]) is served by the runner
account's on-demand servers alone (Conflict). The gateway checks again what it routes (app.gateway.routing.Router.update).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from app.config import Config
from app.core.identity import listed
from app.core.text import stamp_time
from app.errors import Conflict, NotPermitted
from app.llama import rows
from app.store import bookings as booking_rows
from app.store import plans as plan_rows


def check(conn: sqlite3.Connection, config: Config, *, user: str, uid: int, alias: str,
          spans: Sequence[tuple[int, int]], now: int, defaulted: bool = False, plan: int | None = None) -> None:
    """Refuse `user` serving `alias` over `spans` (start, end) when another member holds it then.

    `defaulted`: the alias is the model's name, not one the member chose (the refusal says how to choose one).
    `plan`: the member's own plan for this start, whose age decides a clash with another member's plan.

    A catalog alias ([[models]]) is the runner account's alone: its on-demand plans start it
    (app.service.rules.ondemand); a member's server under it would take the catalog's traffic."""
    if user != config.llama.runner_user and any(entry.alias == alias for entry in config.models):
        raise Conflict(f"alias {alias[:80]} is the team catalog's ([[models]]): it is started on demand; give another"
                       " --alias")
    owners = config.gateway.team_aliases.get(alias)
    if owners is not None:
        if not listed(owners, user):
            raise NotPermitted(f"{alias[:80]} is a team alias that only {', '.join(owners)} may serve"
                               " ([gateway.team_aliases]); give another --alias")
        return
    hint = ("the alias is the model's name unless you give one: pass --alias NAME" if defaulted
            else "give another --alias")

    def overlaps(start: int, end: int) -> bool:
        return any(s < end and start < e for s, e in spans)

    for server in rows.live(conn):
        if server.alias != alias or server.uid == uid:
            continue
        booking = booking_rows.get(conn, server.booking_id)
        end = booking.end if booking is not None else now + 1  # a row without its booking: live now, say
        if overlaps(now, end):
            raise Conflict(f"alias {alias[:80]} is {server.user}'s: their server {server.id} on booking"
                           f" {server.booking_id} serves it until {stamp_time(end, now)}; {hint}")
    for held in plan_rows.holding(conn, alias, now):
        if held["uid"] == uid or (plan is not None and held["plan"] > plan):
            continue
        if overlaps(held["start"], held["end"]):
            raise Conflict(f"alias {alias[:80]} is {held['user']}'s: their planned server {held['plan']} serves it"
                           f" on booking {held['booking']} from {stamp_time(held['start'], now)} to"
                           f" {stamp_time(held['end'], now)}; {hint}")

"""Idle bookings given back ([policy] idle_release_after_min; off by default): one step of each enforcement pass.

A booking is idle while every one of its cards runs no process of its holder (nor one nobody can attribute: it may
be the holder's container) and stays at or under `idle_util_pct` utilisation. How long it has been so comes from the
cards' history (`run_since`, the walk the idle-booked alert makes; with [history] off nothing is ever released).
A booking with a live server or a registered `board run` job (or supervisor) is busy whatever its cards show.

At `after - notice` minutes idle its holder is told, once: the booking's notice, their boards, and a push to the
team's chat ("booking 12 on cards 0,1 is idle: released in 10 min unless used"). It is released no sooner than
`after` minutes idle, `grace` minutes after its start, and `notice` minutes after the notice (what was told is the
agent's `idle_told`, not the database's: a restarted service tells again and waits again). Released, it ends now
(its past stays), audited as the board's "idle_release" with why; the queue moves up (the backfill). A booking busy
again after its notice is not released: the notice is withdrawn, its holder told so, and its idle time counts
from zero again.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable

from app.alerts.engine import run_since
from app.core.cardstate import LOST, UNKNOWN_USER
from app.core.identity import Identity
from app.core.text import cards_text, stamp_time
from app.model import Booking
from app.service.box.notify import push
from app.store import bookings as rows
from app.store.db import write

if TYPE_CHECKING:
    from app.service import Service
    from app.service.conn.agent import Agent

# Who the audit log names for a release: the board itself, as for the backfill's moves.
BOARD = Identity(name="board", uid=os.getuid(), is_admin=True)
ACTION = "idle_release"


def idle_card(util: float | None, users: Iterable[str], holder: str, util_pct: float) -> bool:
    """A card idle for its holder: utilisation known and at or under `util_pct`, and no process of theirs, nor
    one nobody can attribute. Another user's process (a squatter's) does not keep the holder's booking."""
    return util is not None and util <= util_pct and not any(u in (holder, UNKNOWN_USER) for u in users)


def release_pass(server: Agent) -> dict[str, list[int]]:
    """One step of the enforcement pass: notices given, bookings released, notices withdrawn (booking ids)."""
    service = server.service
    done: dict[str, list[int]] = {"idle_told": [], "idle_released": [], "idle_withdrawn": []}
    policy = service.config.policy
    if policy.idle_release_after_min is None or not service.config.history.enabled:
        return done
    told_of = server.idle_told  # booking id -> (the idle run's start, when it goes)
    after, notice, grace = (policy.idle_release_after_min * 60, policy.idle_release_notice_min * 60,
                            policy.idle_release_grace_min * 60)
    now = service.clock()
    live = [b for b in rows.live_between(service.conn, int(now), int(now) + 1)
            if b.active(now) and b.host in ("", service.host)]
    for gone in told_of.keys() - {b.id for b in live}:  # ended, released by hand, moved away: nothing to tell
        del told_of[gone]
    # The samples of the limit and a little, and back to the oldest run told of: a run longer than the samples read
    # would seem to start later at each pass.
    back_to = min([now - after - 2 * service.config.history.sample_s - 60, *(since for since, _ in told_of.values())])
    since = idle_since(service, [b for b in live if now - b.start >= after - notice], now, back_to)
    released = False
    for booking in live:
        told = told_of.get(booking.id)
        began = since.get(booking.id)
        if told is not None and began != told[0]:  # used since the notice: it stays, and the count restarts
            del told_of[booking.id]
            _withdraw(service, booking)
            done["idle_withdrawn"].append(booking.id)
            told = None
        if began is None:
            continue
        due = max(began + after, booking.start + grace)
        if told is None:
            if now >= due - notice:
                told_of[booking.id] = (began, max(due, now + notice))
                _tell(service, booking, *told_of[booking.id], now)
                done["idle_told"].append(booking.id)
        elif now >= told[1]:
            del told_of[booking.id]
            _release(service, booking, began, now)
            done["idle_released"].append(booking.id)
            released = True
    if released:
        service.hub.changed("bookings")
        service.backfill()  # the queue moves up into the time given back
    return done


def idle_since(service: Service, bookings: list[Booking], now: float, back_to: float) -> dict[int, float]:
    """Since when each of `bookings` has been idle on all its cards (the latest of its cards' runs), for those idle
    now: no live server, no registered job, and each card idle in its newest sample and the cards' readings now.
    The samples read go back to `back_to`."""
    policy, sample_s = service.config.policy, service.config.history.sample_s
    registered = {e.booking_id for e in service.processes.live()}
    candidates = [b for b in bookings if b.id not in registered and not rows.live_server_ids(service.conn, b.id)]
    if not candidates:
        return {}
    readings = {r.uuid: r for r in service.fleet.latest().cards}
    samples = service.history.samples(back_to, now + 1)
    found: dict[int, float] = {}
    for booking in candidates:
        def holds(s: dict, booking: Booking = booking) -> bool:
            return (s["booking"] == booking.id and s["state"] != LOST
                    and idle_card(s["util"], (u["user"] for u in s["users"]), booking.user, policy.idle_util_pct))

        now_idle = all((r := readings.get(uuid)) is not None and not r.lost and idle_card(
            r.utilization_pct, (p.user or UNKNOWN_USER for p in r.processes), booking.user, policy.idle_util_pct)
            for uuid in booking.card_uuids)
        runs = run_since(samples, booking.card_uuids, holds, now=now, max_gap_s=2 * sample_s + 60)
        if now_idle and all(uuid in runs for uuid in booking.card_uuids):
            found[booking.id] = max(runs[uuid] for uuid in booking.card_uuids)
    return found


def _tell(service: Service, booking: Booking, since: float, release_at: float, now: float) -> None:
    """The notice: on the booking, to the holder's boards, and to the team's chat (once per idle run)."""
    minutes = max(1, int(release_at - now + 59) // 60)
    cards = cards_text(booking.cards)
    with write(service.conn):
        rows.set_notice(service.conn, booking.id, f"idle since {stamp_time(since, now)}: released at"
                                                  f" {stamp_time(release_at, now)} unless used")
        push(service, "idle.notice", f"booking {booking.id} of {booking.user} on {cards} is idle: released in"
                                     f" {minutes} min unless used",
             fields=(("booking", str(booking.id)), ("user", booking.user)),
             key=f"idle:{booking.id}:{int(since)}:notice")
    service.hub.publish("notice", {"message": f"booking {booking.id} on {cards} is idle: released in {minutes} min"
                                              " unless used"}, uid=booking.uid)
    service.hub.changed("bookings")


def _withdraw(service: Service, booking: Booking) -> None:
    """Busy again after its notice: the holder hears it stays, and so does the chat that heard the notice."""
    with write(service.conn):
        rows.set_notice(service.conn, booking.id, "in use again: not released")
        push(service, "idle.withdrawn", f"booking {booking.id} of {booking.user} is in use again: not released",
             fields=(("booking", str(booking.id)), ("user", booking.user)))
    service.hub.publish("notice", {"message": f"booking {booking.id} is in use again: it will not be released"},
                        uid=booking.uid)
    service.hub.changed("bookings")


def _release(service: Service, booking: Booking, since: float, now: float) -> None:
    """End it now, its past kept, audited with why; its holder and the chat told."""
    policy = service.config.policy
    cards = cards_text(booking.cards)
    idle_min = int(now - since) // 60
    details = {"idle_since": int(since), "idle_min": idle_min, "idle_util_pct": policy.idle_util_pct,
               "cards": list(booking.cards), "end": booking.end}

    def change(at: int) -> int:
        rows.set_times(service.conn, booking.id, booking.start, at)
        rows.set_notice(service.conn, booking.id, f"released: idle since {stamp_time(since, now)}")
        push(service, "idle.released", f"booking {booking.id} of {booking.user} on {cards} released: idle for"
                                       f" {idle_min} min", fields=(("booking", str(booking.id)), ("user", booking.user)),
             key=f"idle:{booking.id}:{int(since)}:released")
        return booking.id

    service.bookings(BOARD).audited(ACTION, details, change, filed_under=lambda made: made)
    service.hub.publish("notice", {"message": f"booking {booking.id} on {cards} was released: idle for {idle_min} min"
                                              f" (no process of yours, at most {policy.idle_util_pct:g} % busy)"},
                        uid=booking.uid)

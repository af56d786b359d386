"""`board run` jobs under the service: who may run on a booking, and what happens when the booking is over.

A job may run only on its caller's own booking, active now (`run_booking`; refusals are audited). Once
its booking is over (ended, cancelled, split away, moved to other cards or given to someone else), an
enforcement pass (`enforce_once`) sends SIGTERM, then SIGKILL after [enforce] grace_s, or with
run_jobs = "warn" only audits it. Ten minutes before the end the holder gets one notice.
llama-servers have their own pass, app.service.box.servers.enforce_servers, run from the same one.
Idle bookings are given back ([policy] idle_release_after_min) by app.service.box.idle.release_pass, from it too.
"""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING

from app.core.identity import Identity
from app.core.text import format_cards, relative, stamp_time
from app.errors import BadInput, BoardError, NotPermitted
from app.faults.oom import record_job_oom
from app.model import Booking
from app.service.box.alerts import enforcer_alerts
from app.service.rules.audit import AGENT, audit
from app.service.fleet.hosts import refuse_remote
from app.service.fleet.lastknown import unreachable
from app.service.rules.ondemand import keep_pass
from app.service.rules.plans import start_due
from app.service.box.idle import release_pass
from app.service.box.processes import UNREAD
from app.service.box.servers import enforce_servers
from app.store import bookings as rows
from app.store import jobs
from app.store.db import StoreLocked, write

if TYPE_CHECKING:
    from app.service import Service
    from app.service.conn.agent import Agent

WARN_BEFORE_END_S = 600

log = logging.getLogger(__name__)


def run_booking(service: Service, me: Identity, booking_id: int | None, waiting: bool = False) -> Booking:
    """The booking a `board run` job of `me` may run under now: the one named, or the only active one.
    `waiting` (`board run --wait`): only whose it is counts yet; the job registers once it has started."""
    now = service.clock()
    try:
        if booking_id is not None:
            booking = service.bookings(me).get(booking_id)
            if booking.uid != me.uid:
                raise NotPermitted(f"booking {booking.id} belongs to {booking.user}; run on your own booking")
            refuse_remote(service, booking)
            if waiting:
                return booking
            if not booking.active(now):
                when = (f"ended {stamp_time(booking.end, now)}, {relative(booking.end, now)}" if booking.end <= now
                        else f"starts {stamp_time(booking.start, now)}, {relative(booking.start, now)}")
                raise NotPermitted(f"booking {booking.id} is not active now ({when})")
            return booking
        everywhere = [b for b in rows.live_between(service.conn, int(now), int(now) + 1) if b.uid == me.uid]
        mine = [b for b in everywhere if b.host in ("", service.host)]
        if everywhere and not mine:  # held on another host only: run it there
            refuse_remote(service, everywhere[0])
        if not mine:
            raise NotPermitted("you have no active booking; book cards first: board book 1 --for 2h")
        if len(mine) > 1:
            raise BadInput(f"you hold {len(mine)} active bookings; pick one with --booking ID")
        return mine[0]
    except NotPermitted as refused:
        audit(service, me, "run", booking_id, ok=False, details={"refused": str(refused)})
        raise


def is_over(booking: Booking | None, entry, now: float) -> bool:
    """A job's booking is over: ended, cancelled or split away, moved to other cards, or changed hands."""
    return (booking is None or not booking.active(now) or booking.uid != entry.uid
            or tuple(sorted(booking.card_uuids)) != tuple(sorted(entry.cards)))


def enforce_once(server: Agent) -> dict[str, list[int]]:
    """One pass for `server` (the agent, app.service.conn.agent: its service and registry); returns what it did, by entry id.

    While a PostgreSQL database is unreachable, the jobs are enforced from the bookings last read (each job's
    booking as this pass last read it, `Registration.known`): a job whose booking is live there runs on, one whose
    booking ended by then is stopped, its audit event left to the log. The passes that need the database (backfill,
    servers, planned servers, idle release, alerts) wait for it. So while a lock another session holds outlasts the lock timeout
    (StoreLocked): the jobs are read and stopped as ever; what needs the lock is logged and tried at the next pass."""
    service, registry = server.service, server.service.processes
    done: dict[str, list[int]] = {"ended": [], "terminated": [], "killed": [], "warned": []}
    now = service.clock()
    away = False
    try:
        for entry in registry.sweep():
            done["ended"].append(entry.id)
            if entry.kind == "job":
                with write(service.conn):
                    jobs.forget(service.conn, entry.pid, entry.started_ticks)
                    record_job_oom(service.conn, ts=service.clock(), snapshot=service.fleet.cached(),
                                   card_uuids=entry.cards, booking_id=entry.booking_id, pid=entry.pid)
        service.backfill()  # a squatter gone, a booking ended early by enforcement: queued bookings move up
        _tell_started(server, now)
        done.update(enforce_servers(server))
        done["planned_started"] = start_due(server)
        done["preloaded"] = keep_pass(server)  # after start_due: a model it books starts at the next pass, or at once
        done.update(release_pass(server))  # after the servers' pass: a server that just ended is seen ended
    except BoardError as error:
        if isinstance(error, StoreLocked):  # another session holds a lock for long: the jobs' enforcement goes on
            log.warning(f"enforcement pass: {error}")
        elif not unreachable(error):
            raise
        away = True
    settings = service.config.enforce
    for entry in registry.live():
        if entry.kind == "server":
            continue
        try:
            booking = entry.known = rows.get(service.conn, entry.booking_id)
        except BoardError as error:
            if not unreachable(error):
                raise
            if entry.known is UNREAD:  # registered and not read since: nothing known to stop it for
                continue
            booking = entry.known
        if booking is not None and not is_over(booking, entry, now):
            if booking.end - now <= WARN_BEFORE_END_S and not entry.warned:
                entry.warned = True
                minutes = max(1, int(booking.end - now + 59) // 60)
                service.hub.publish("notice", {"message": f"booking {booking.id} ends in {minutes} min; your job"
                                                          f" (pid {entry.pid}) will be stopped then"}, uid=entry.uid)
            continue
        if settings.run_jobs == "warn":
            if entry.term_sent_at is None:
                entry.term_sent_at = now
                _audit(server, "job-warn", entry.booking_id, {"pid": entry.pid})
                done["warned"].append(entry.id)
            continue
        if entry.term_sent_at is None:
            entry.term_sent_at = now
            sent = registry.signal(entry, signal.SIGTERM)
            log.info(f"job {entry.pid} (uid {entry.uid}): booking {entry.booking_id} ended; SIGTERM")
            _audit(server, "job-stop", entry.booking_id,
                   {"pid": entry.pid, "signal": "SIGTERM", "pids": sent, "grace_s": settings.grace_s})
            done["terminated"].append(entry.id)
        elif now - entry.term_sent_at >= settings.grace_s:
            sent = registry.signal(entry, signal.SIGKILL)
            if sent:
                log.warning(f"job {entry.pid} (uid {entry.uid}): still running after {settings.grace_s:g} s; SIGKILL")
                _audit(server, "job-stop", entry.booking_id, {"pid": entry.pid, "signal": "SIGKILL", "pids": sent})
                done["killed"].append(entry.id)
    if not away:
        done["alerts"] = enforcer_alerts(server).get("fired", [])  # last: a failing alert pass leaves the jobs enforced
    return done


def _audit(server: Agent, action: str, booking_id: int, details: dict) -> None:
    """The agent's audit event for an enforcement; while the database is unreachable, said in the log instead
    (the signal has gone already: enforcement does not wait for the database)."""
    try:
        audit(server.service, AGENT, action, booking_id, ok=True, details=details)
    except BoardError as error:
        if not (unreachable(error) or isinstance(error, StoreLocked)):
            raise
        log.warning(f"{action} of booking {booking_id} not audited: {error}")


def _tell_started(server: Agent, now: float) -> None:
    """Each holder whose booking started since the last pass hears of it (their open boards toast it)."""
    since = server.started_told_until
    server.started_told_until = now
    if since is None:  # a fresh service: bookings that started before it did are old news
        return
    for booking in rows.live_between(server.service.conn, int(since), int(now) + 1):
        if since < booking.start <= now:
            server.service.hub.publish("notice", {
                "message": f"booking {booking.id} has started: cards {format_cards(booking.cards)} until"
                           f" {stamp_time(booking.end, now)}"}, uid=booking.uid)

"""Alerts in the service: gather what the rules need, diff their findings against the firing rows, fire and resolve.

`Engine.run` is one pass, on the database thread (the enforcer's pass calls it, through app.service.box.alerts). In one
transaction, which the caller holds:
- a finding with no firing row fires (a new row); one with a firing row refreshes its `last_seen` and message;
- a firing row with no finding is resolved;
- the team chat gets each fire and resolve (the pass returns them as `Push`es, which the service's side,
  app.service.box.alerts, puts in the outbox in the pass's own transaction), except
  - a per-user alert (a booking ending soon): its holder alone hears of it, as a hub "notice" (their boards);
  - a repeat: the same rule and subject was pushed less than `[alerts] repeat_min` ago; it is recorded, not
    pushed, and neither is its resolve;
  - quiet hours (`[alerts] quiet`, local time of [policy] timezone): recorded, not pushed. When quiet ends,
    what fired then and still fires is pushed, and so is the resolve of what was pushed before and resolved
    during quiet; what fired and resolved within quiet is only recorded (`board alerts --all` shows it).
Per-user notices are not held by quiet hours: they reach only the holder's own board.
A finding fires only once it has held `[alerts] fire_after_s` (60 s): a card squatted for the moment between
its holder's release and rebook fires nothing.
What was pushed or held back is in the alert's row (`pushed_at`, `held`), written in the transaction that puts
the push in the outbox: a restart loses no held push and repeats none.
Alerts are not written to the audit log: their rows are their own record, and the audit log is who did what.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Collection

from app.alerts.rules import Card, Crash, Ending, Inputs, evaluate
from app.config import Config
from app.core.cardstate import BOOKED, UNKNOWN_USER, fleet_status
from app.core.identity import Identity
from app.faults import store as fault_rows
from app.gpu.model import FleetSnapshot
from app.history.store import HistoryStore
from app.notify.summary import zone
from app.store import bookings as rows

MONTH_S = 30 * 86400
FOREVER = 2**62


def quiet_at(now: float, quiet: tuple[int, int] | None, tz) -> bool:
    """Whether `now` falls in the quiet hours (start, end minutes of the local day; wrapping midnight)."""
    if quiet is None:
        return False
    local = datetime.fromtimestamp(now, tz)
    minute = local.hour * 60 + local.minute
    start, end = quiet
    return start <= minute < end if start <= end else (minute >= start or minute < end)


@dataclass(frozen=True)
class Push:
    """A message for the team's chat that a pass wants sent (app.service.box.notify.push makes it an outbox row)."""

    kind: str  # "alert.firing" or "alert.resolved"
    title: str
    fields: tuple[tuple[str, str], ...]
    key: str  # the outbox's once-only key: one push per alert and state


@dataclass
class Pass:
    """What one pass did (alert ids), and what it wants done: pushes in its transaction, notices after it."""

    fired: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)
    pushed: list[int] = field(default_factory=list)
    pushes: list[Push] = field(default_factory=list)
    notices: list[tuple[int, str]] = field(default_factory=list)  # (uid, message): to the holder's boards alone

    def ids(self) -> dict[str, list[int]]:
        return {"fired": self.fired, "resolved": self.resolved, "pushed": self.pushed}


def gather(conn: sqlite3.Connection, snapshot: FleetSnapshot, history: HistoryStore, config: Config,
           now: float) -> Inputs:
    """What the rules read: the fleet now, the history over the window, the bookings, faults and servers."""
    settings = config.alerts
    live = rows.live_between(conn, int(now), FOREVER)
    statuses = fleet_status(snapshot, live, now)  # the states and holders: no warning or label reaches a rule
    util_mean, idle_since = _history(history, config, now, {s.reading.uuid for s in statuses if s.state == BOOKED})
    cards = []
    for s in statuses:
        r, holder = s.reading, s.booking.user if s.booking else None
        squatters = tuple(u for u in s.users if u != holder)
        containers = tuple(sorted({p.container for p in r.processes
                                   if p.container and (p.user or UNKNOWN_USER) != holder}))
        cards.append(Card(r.index, r.uuid, s.state, r.memory_used_mib, r.memory_total_mib, r.temperature_c, holder,
                          squatters, idle_since.get(r.uuid), containers, r.power_limit_w,
                          config.power.policy_w(r.index)))
    then = int(now - settings.window_min * 60)
    # The queue then: bookings made by then, queued, not started by then (a queued booking that moved up since
    # counts as it is now, queued or not: the rows keep no history).
    queued = "SELECT count(*) FROM bookings WHERE status = 'booked' AND queued IS NOT NULL AND created_at <= ? AND starts_at > ?"
    queued_before = conn.execute(queued, (then, then)).fetchone()[0]
    queued_now = conn.execute(queued, (int(now), int(now))).fetchone()[0]
    waits = tuple(w for (w,) in conn.execute(
        "SELECT starts_at - requested_at FROM bookings WHERE status = 'booked' AND starts_at > ? AND starts_at <= ?"
        " AND requested_at > 0", (then, int(now))))
    faults = fault_rows.count(conn, now - MONTH_S, kinds=("oom", "xid"))
    crashes = tuple(Crash(i, user, ended, model.rsplit("/", 1)[-1]) for i, user, ended, model in conn.execute(
        "SELECT id, \"user\", ended_at, model FROM servers WHERE state = 'crashed' AND ended_at >= ?",
        (int(now - settings.crashed_min * 60),)))
    ending = tuple(Ending(b.id, b.uid, b.end) for b in rows.live_between(conn, int(now), int(now) + 1)
                   if b.end - now <= settings.ending_min * 60)
    return Inputs(now, tuple(cards), util_mean, queued_now, queued_before, waits, faults, crashes, ending)


def _history(history: HistoryStore, config: Config, now: float,
             booked: set[str]) -> tuple[float | None, dict[str, float]]:
    """The fleet's mean utilisation over the window, and for each card BOOKED now, since when it has been BOOKED
    (one booking, unbroken) in the samples. Nothing when the history is off."""
    if not config.history.enabled:
        return None, {}
    settings = config.alerts
    span = max(settings.window_min * 60, settings.idle_booked_min * 60 + 2 * config.history.sample_s + 60)
    samples = history.samples(now - span, now + 1)
    window = [s["util"] for s in samples if s["ts"] >= now - settings.window_min * 60 and s["state"] != "LOST"
              and s["util"] is not None]
    util = sum(window) / len(window) if window else None
    return util, run_since(samples, booked, lambda s: s["state"] == BOOKED)


def run_since(samples: list[dict], uuids: Collection[str], holds: Callable[[dict], bool], *,
              now: float | None = None, max_gap_s: float | None = None) -> dict[str, float]:
    """For each card of `uuids`, the start of its newest unbroken run of `samples` (oldest first) for which `holds`,
    under one booking: the idle-booked alert's (holds: BOOKED) and the idle release's (app.service.box.idle). With
    `max_gap_s`, a gap longer than it between two samples, or between the newest and `now`, breaks the run: the
    sampler was down, and nobody saw what ran meanwhile."""
    since: dict[str, float] = {}
    holding: dict[str, int | None] = {}  # the booking of each card's newest sample
    after: dict[str, float] = {}  # the sample seen last (newer) of each card, or `now`
    broken: set[str] = set()
    for s in reversed(samples):  # newest first: walk back while the card's run holds under one booking
        uuid = s["uuid"]
        if uuid not in uuids or uuid in broken:
            continue
        later = after.get(uuid, now)
        gap = max_gap_s is not None and later is not None and later - s["ts"] > max_gap_s
        if gap or not holds(s) or holding.setdefault(uuid, s["booking"]) != s["booking"]:
            broken.add(uuid)
            continue
        since[uuid] = after[uuid] = s["ts"]
    return since


class Engine:
    """The alerts' state lives in their rows (`pushed_at`, `held`), so a restarted service carries on where it
    was; only how long each new finding has held so far is kept here (a restart starts that count again)."""

    def __init__(self) -> None:
        self.seen_since: dict[tuple[str, str], float] = {}  # each finding's first pass, unbroken since

    def run(self, conn: sqlite3.Connection, config: Config, now: float, inputs: Inputs, *,
            told: frozenset[str] = frozenset()) -> Pass:
        """One pass at `now`, inside the caller's write transaction; the pushes it returns belong in the same one,
        so that an alert's row and its push commit together. `told`: subjects whose user has heard already (a
        `board run` job's own ten-minute notice), so their per-user alert is recorded, not repeated."""
        settings = config.alerts
        # In (rule, subject) order: what one pass fires gets its ids, and its pushes go out, in the same order
        # every time, not in the order of a set of strings.
        findings = dict(sorted(((f.rule, f.subject), f) for f in evaluate(inputs, settings)))
        self.seen_since = {key: self.seen_since.get(key, now) for key in findings}
        quiet = quiet_at(now, settings.quiet_minutes(), zone(config.policy.timezone))
        done = Pass()
        firing = {(rule, subject): (id, message, pushed_at) for id, rule, subject, message, pushed_at
                  in conn.execute("SELECT id, rule, subject, message, pushed_at FROM alerts WHERE state = 'firing'")}
        for key, f in findings.items():
            if key in firing:
                conn.execute("UPDATE alerts SET last_seen = ?, message = ? WHERE id = ?",
                             (int(now), f.message, firing[key][0]))
                continue
            if now - self.seen_since[key] < settings.fire_after_s:
                continue  # not for long enough yet: a moment's squatter between a release and a rebook
            id = conn.execute("INSERT INTO alerts (rule, subject, state, fired_at, last_seen, message, uid)"
                              " VALUES (?, ?, 'firing', ?, ?, ?, ?)",
                              (f.rule, f.subject, int(now), int(now), f.message, f.uid)).lastrowid
            assert id is not None  # an INSERT that ran numbers its row
            done.fired.append(id)
            if f.uid is not None:
                if f.subject not in told:
                    done.notices.append((f.uid, f.message))
            elif quiet:
                conn.execute("UPDATE alerts SET held = 'fire' WHERE id = ?", (id,))
            elif now - _last_push(conn, key) >= settings.repeat_min * 60:
                _push(conn, now, "firing", id, f.rule, f.subject, f.message, done)
            # else a repeat: recorded, not pushed, and neither will its resolve be
        for key, (id, message, pushed_at) in firing.items():
            if key in findings:
                continue
            conn.execute("UPDATE alerts SET state = 'resolved', resolved_at = ? WHERE id = ?", (int(now), id))
            done.resolved.append(id)
            if pushed_at is None:  # never told (per-user, a repeat, or fired and resolved within quiet hours)
                conn.execute("UPDATE alerts SET held = NULL WHERE id = ?", (id,))
            elif quiet:
                conn.execute("UPDATE alerts SET held = 'resolve' WHERE id = ?", (id,))
            else:
                _push(conn, now, "resolved", id, *key, message, done)
        if not quiet:
            _flush(conn, now, done)
        return done


def _push(conn: sqlite3.Connection, now: float, state: str, id: int, rule: str, subject: str, message: str,
          done: Pass) -> None:
    """A push for the outbox, with what the alert's row says of it, in the pass's transaction: told once, whatever
    stops the service when."""
    title = message if state == "firing" else f"resolved: {message}"
    done.pushes.append(Push(f"alert.{state}", title, (("rule", rule), ("subject", subject)), f"alert:{id}:{state}"))
    if state == "firing":
        conn.execute("UPDATE alerts SET pushed_at = ?, held = NULL WHERE id = ?", (int(now), id))
    else:
        conn.execute("UPDATE alerts SET held = NULL WHERE id = ?", (id,))
    done.pushed.append(id)


def _flush(conn: sqlite3.Connection, now: float, done: Pass) -> None:
    """Outside quiet hours: push what fired in them and still fires, then the resolves they held back."""
    held = conn.execute("SELECT id, rule, subject, message, held FROM alerts WHERE held IS NOT NULL"
                        " ORDER BY held, id").fetchall()  # 'fire' before 'resolve'
    for id, rule, subject, message, what in held:
        _push(conn, now, "firing" if what == "fire" else "resolved", id, rule, subject, message, done)


def _last_push(conn, key: tuple[str, str]) -> float:
    """When this rule last pushed a fire about this subject (-inf: never)."""
    found = conn.execute("SELECT max(pushed_at) FROM alerts WHERE rule = ? AND subject = ?", key).fetchone()[0]
    return float("-inf") if found is None else found


def listing(conn: sqlite3.Connection, me: Identity, *, all: bool = False, limit: int = 200) -> list[dict]:
    """The alerts `me` may see, newest first: firing ones (and, with `all`, resolved ones too). A per-user alert
    is shown to its user alone."""
    where = "" if all else "WHERE state = 'firing'"
    found = []
    for row in conn.execute(
            f"SELECT id, rule, subject, state, fired_at, resolved_at, last_seen, message, uid FROM alerts {where}"
            " ORDER BY fired_at DESC, id DESC"):
        if row[8] is not None and row[8] != me.uid:
            continue
        found.append(dict(zip(("id", "rule", "subject", "state", "fired_at", "resolved_at", "last_seen", "message",
                               "uid"), row)))
        if len(found) >= limit:
            break
    return found

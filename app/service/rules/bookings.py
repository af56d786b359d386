"""Booking rules: create, cancel, release, extend and reassign, each one short IMMEDIATE transaction.

Every change and every refusal by rule (conflict, not permitted) is written to the audit log.
Bad input writes nothing, except from an admin's reassign: an admin acting on someone else's booking
leaves a trace whatever the outcome.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence, TypedDict, TypeVar, cast

from app.config import CLASSES, Config
from app.core import fairshare, policy, projects
from app.errors import BadInput, BoardError, Conflict, NotPermitted, error_for
from app.core.hardware import group_crossing
from app.core.identity import Identity, lookup_user
from app.core.text import cards_text, format_cards, format_duration, stamp_time, stamp_when
from app.model import Booking
from app.core.cardstate import UNKNOWN_USER
from app.core.slots import GROUP_SIZES, best_group, is_free
from app.gpu.model import CardReading, GpuProcess, Topology
from app.store import bookings as rows
from app.store import events
from app.store.db import write

MAX_NOTE_CHARS = 500
PAST_GRACE_SECONDS = 60
OVER_BUDGET = "past the budget by an admin: "  # the note and the audit's over_budget: --force, --override-policy
# Slot searches first read the calendar this far past the wanted slot, and all of it only when that
# finds nothing: a full calendar is a long read to hold the write lock for.
LOOKAHEAD_SECONDS = 86400
MAX_CANDIDATES = 60  # booking ends tried as starts by `options`: enough for 3 slots on a busy calendar
MAX_BACKFILL_ROUNDS = 10  # each round moves at least one booking earlier; a bound, not an expected count
YIELD_GAP_SECONDS = 10  # an on-demand booking ends this long before the booking that takes its cards
LEASE_MIN_STEP_SECONDS = 5  # a lease that would move an end by less writes nothing: it runs every few seconds
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Plan:
    """A booking that passed every rule, ready to insert."""

    cards: tuple[int, ...]
    uuids: tuple[str, ...]
    start: int
    end: int
    notes: tuple[str, ...] = ()  # one line each: cards passed over or taken despite what runs on them now
    project: str = projects.IMPLICIT  # what it is for ([[projects]])
    over_budget: str | None = None  # an admin's --force took it past its project's budget: by how much (audited)


@dataclass(frozen=True, slots=True)
class _Scope:
    """What the plan being made is for: an on-demand booking (the catalog's: exempt from the rules about people,
    app.model.Booking.on_demand), and the cards a count may take its group from (None: any)."""

    on_demand: bool = False
    within: frozenset[int] | None = None


class _Search(TypedDict):
    """What `_earliest` looks for: `_plan`'s request, which a refusal carries (`_retry`)."""

    cards: tuple[int, ...] | None
    count: int | None
    klass: str
    start: int
    duration: int
    excluding: int | None
    user: str | None
    project: str


def _worded(method):
    """Adds the earliest start that works to a refusal on its way out, once the write lock is released:
    a scan of the calendar has no place inside it. A refusal carries what to search for in `earliest` (the
    `earliest` operation's arguments). Behind the socket (`word_refusals` off) it leaves unworded, and the client
    asks for the second half only when it shows the message (app.errors.BoardError.rest): a refusal nobody reads
    costs no search."""

    @functools.wraps(method)
    def wrapper(self: BookingService, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (Conflict, NotPermitted) as refused:
            search = getattr(refused, "earliest", None)
            if search is None or not self.word_refusals:
                raise
            raise error_for(refused.exit_code, f"{refused}; {self.earliest_words(search)}") from None

    return wrapper


def _retry(error: BoardError, *, cards: Sequence[int] | None, count: int | None, klass: str, start: int,
           duration: int, excluding: int | None = None, user: str | None = None,
           project: str = projects.IMPLICIT) -> BoardError:
    """Mark a refusal with the search that finds a start that works instead: the `earliest` operation's arguments."""
    search = {"cards": list(cards) if cards is not None else None, "count": count, "class": klass, "start": start,
              "duration": duration, "excluding": excluding, "user": user, "project": project or None}
    error.earliest = {k: v for k, v in search.items() if v is not None}  # type: ignore[attr-defined]
    return error


def refused_by(refusal: BoardError) -> str:
    """The audit's refusal category, counted by /metrics: "conflict" (the time is taken) or "policy" (a rule)."""
    return "conflict" if isinstance(refusal, Conflict) else "policy"


class BookingService:
    """The rules, bound to one connection, one caller and one view of the cards."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        me: Identity,
        config: Config,
        cards: Sequence[CardReading],
        topology: Topology,
        clock: Callable[[], float] = time.time,
        jobs: Callable[[int], list[int]] = lambda booking_id: [],
        users: Callable[[str], tuple[str, int] | None] = lookup_user,
        host: str = "",
    ):
        self.conn, self.me, self.config, self.topology, self.clock = conn, me, config, topology, clock
        self.host = host  # the host these cards are on ([fleet] host): a booking's cards are all on one host
        self.down_since: float | None = None  # that host's last heartbeat, when it is down (HOST DOWN; the service sets it)
        self.jobs = jobs  # booking id -> pids of the `board run` jobs registered for it (the service knows)
        self.users = users  # a user name -> (name, uid): the accounts here (and the demo's people, in the demo)
        self.cards = {c.index: c for c in cards}
        self.by_uuid = {c.uuid: c.index for c in cards}
        self.told: list[tuple[int, str]] = []  # (uid, message): notices for the service to publish after a change
        self._others: tuple[int, dict[int, list[GpuProcess]]] | None = None  # (now, _others_now's answer)
        # During a search (`_searching`), each budget period's bookings, read once: a search tries many starts.
        self._periods: dict[tuple[int, int], list[Booking]] | None = None
        # A refusal of book, plan or reassign gets its second half (earliest_words) here; behind the socket it is off:
        # the client asks for it when it shows the message (op earliest).
        self.word_refusals = True
        # The store has no writer but this service (SQLite behind the agent): a count is planned once, under the
        # write lock, rather than first on a plain read to keep the lock short for others.
        self.sole_writer = False
        self._scope = _Scope()  # set while an on-demand booking is planned (`_planning`)

    # -- queries -------------------------------------------------------------------------------

    def get(self, booking_id: int) -> Booking:
        booking = rows.get(self.conn, booking_id)
        if booking is None:
            raise BadInput(f"no booking {booking_id}; 'board list' shows the bookings")
        return booking

    def _plan(
        self,
        *,
        cards: Sequence[int] | None = None,
        count: int | None = None,
        start: int,
        end: int,
        klass: str = "experiment",
        or_later: bool = False,
        excluding: int | None = None,
        user: str | None = None,
        force: bool = False,
        project: str | None = None,
    ) -> Plan:
        """Check a booking against every rule without writing; raises the error `create` would.
        `user`: whose limit on cards at once applies (default the caller's: an admin may act for a holder).
        `force`: named cards on a host that is down may start now (`_host_down`); an admin's booking may pass its
        project's budget. `project`: what it is for (--project), default the holder's only project.

        It starts at `start` or not at all, unless `or_later`: then at the earliest start from `start` on
        that every rule accepts."""
        now = int(self.clock())
        klass = self._check_class(klass)
        on_demand = self._scope.on_demand
        if on_demand:  # the catalog is the admin's: its project is the entry's, whoever holds the booking
            project = self._catalog_project(project or projects.IMPLICIT, klass)
        else:
            self._check_access(klass, user)
            project = self._check_project(project, klass, user)
        if start < now - PAST_GRACE_SECONDS:
            raise BadInput(f"the start {stamp_time(start, now)} is in the past; pick a start from now on")
        if end <= start:
            raise BadInput("the end must be after the start")
        chosen = self._check_cards(cards) if cards is not None else None
        if chosen is None and count not in GROUP_SIZES:
            raise BadInput(f"a group is 1, 2, 4 or 8 cards, not {count}")
        if not on_demand:  # its span grows by leases: neither the longest booking nor how far ahead applies
            policy.check_span(self.config, start=start, end=end, now=now)  # no other start helps with these
        down = self._host_down(chosen, start, now, force)  # refuses one that starts now; a note for any other
        search = _Search(cards=chosen, count=count, klass=klass, start=start, duration=end - start, excluding=excluding,
                         user=user, project=project)
        try:
            plan = self._plan_at(chosen, count, klass, start, end - start, now, excluding, user=user, project=project,
                                 over_budget=force and self.me.is_admin)
        except (Conflict, NotPermitted) as refused:
            if on_demand:
                raise  # its caller words the refusal (model_demand): a member's search says nothing to it
            if not or_later:
                raise _retry(refused, **search) from None
            found = self._earliest(**search)
            if found is None:
                raise _retry(refused, **search) from None
            plan = replace(found, notes=(f"starts later than asked: {refused}", *found.notes))
        return replace(plan, notes=(down, *plan.notes)) if down else plan

    plan = _worded(_plan)

    def _plan_at(
        self, cards: tuple[int, ...] | None, count: int | None, klass: str, start: int, duration: int, now: int,
        excluding: int | None, busy: dict | None = None, held: list[Booking] | None = None,
        now_slot: bool | None = None, user: str | None = None, project: str = projects.IMPLICIT,
        over_budget: bool = False, yielding: dict | None = None,
    ) -> Plan:
        """The booking at exactly `start`, or the refusal that names the rule (NotPermitted) or the holder (Conflict).

        `busy`, `yielding` (the on-demand bookings', `_busy_by_index`) and `held` (the caller's live bookings), when
        given, save the reads: `_earliest` tries many starts.
        `over_budget`: an admin's forced booking passes its project's budget."""
        end = start + duration
        if now_slot is None:  # what runs on the cards now says nothing about a slot that starts later
            now_slot = start <= now + PAST_GRACE_SECONDS
        notes: list[str] = []
        if cards is not None:
            for card in cards:
                if reason := policy.card_refusal(self.config, card, klass, start, end, project=project):
                    raise NotPermitted(f"card {card}: {reason}")
            if busy is None:
                self._check_free(cards, start, end, excluding)
            elif not is_free(busy, cards, (start, end)):
                raise Conflict("taken")  # a search only needs to know; the one refusal shown is worded
            chosen = cards
            if now_slot:
                mine = self._held_now(now)
                notes = [f"card {i} has {self._whose(found, named=True)} now"
                         for i in chosen if (found := self._foreign(self.cards[i], i in mine))]
        else:
            assert count is not None  # no cards named: a group size (_plan checked it)
            chosen, notes = self._pick(count, klass, start, duration, now, now_slot, excluding, busy, project,
                                       yielding)
        # No limit on cards at once for an on-demand booking: the runner's account holds them all. The pools' rules
        # and the allocations (card_refusal) held its cards above, named or picked.
        if not self._scope.on_demand:
            if held is None:
                held = rows.live_between(self.conn, start, end, user=user or self.me.name)
            spans = [(b.start, b.end, len(b.cards)) for b in held if b.id != excluding]
            policy.check(self.config, cards=chosen, klass=klass, start=start, end=end, now=now, held=spans,
                         project=project)
        if over := self._check_budget(project, [(start, end)], len(chosen), excluding, over_budget):
            notes.append(over)
        if len(chosen) > 1 and (crossing := group_crossing(self.topology, list(self.cards.values()), chosen)):
            notes.append(crossing)  # the group works, but its cards talk through the CPU
        return Plan(chosen, tuple(self.cards[i].uuid for i in chosen), start, end, tuple(notes), project, over)

    def _earliest(
        self, *, cards: tuple[int, ...] | None, count: int | None, klass: str, start: int, duration: int,
        excluding: int | None = None, user: str | None = None, project: str = projects.IMPLICIT,
    ) -> Plan | None:
        """The earliest booking from `start` on, within how far ahead a booking may start, that every rule accepts.

        A slot can only open at `start`, where some booking ends (cards come free, the caller's own count
        drops), where a pool's window opens or an allocation closes, or where the project's budget resets; each of
        those is tried in turn."""
        now = int(self.clock())
        horizon = now + int(self.config.policy.max_ahead_days * 86400)
        # Asked for now, the cards with someone else's processes stay out of every later start too:
        # nobody knows when those processes end.
        now_slot = start <= now + PAST_GRACE_SECONDS
        opens = self._opens(klass, start, horizon + 1, project)
        # The next day past the slot first, all of the calendar only when that finds nothing: a full
        # calendar is a long read, and this may run under the write lock.
        with self._searching():
            for until in (start + duration + LOOKAHEAD_SECONDS, None):
                busy = self._busy_by_index(start, until, excluding)
                yielding = self._busy_by_index(start, until, excluding, yielding=True)
                held = rows.live_between(self.conn, start, until or 2**62, user=user or self.me.name)
                ends = {e for spans in busy.values() for _, e in spans if e > start}
                for candidate in sorted({start, *ends, *opens}):
                    if candidate > horizon or (until is not None and candidate + duration > until):
                        break
                    # Cheap first: a start where the cards (or enough cards) are taken cannot work, whatever the rules.
                    wanted = (candidate, candidate + duration)
                    if cards is not None:
                        taken = not is_free(busy, cards, wanted)
                    else:
                        assert count is not None  # no cards named: a group size (_plan checked it)
                        taken = sum(is_free(busy, (i,), wanted) for i in self._candidates()) < count
                    if taken:
                        continue
                    try:
                        return self._plan_at(cards, count, klass, candidate, duration, now, excluding, busy, held, now_slot,
                                             project=project, yielding=yielding)
                    except (Conflict, NotPermitted):
                        continue
        return None

    @contextlib.contextmanager
    def _searching(self) -> Iterator[None]:
        """Within a search nothing is written: each budget period's bookings are read once for all its starts."""
        self._periods = {}
        try:
            yield
        finally:
            self._periods = None

    @contextlib.contextmanager
    def _planning(self, scope: _Scope) -> Iterator[None]:
        """Plan for `scope` (an on-demand booking, a count within some cards) until the block ends."""
        before, self._scope = self._scope, scope
        try:
            yield
        finally:
            self._scope = before

    def _candidates(self) -> list[int]:
        """The cards a count may take its group from: `within` while it is set (`_planning`), else every card."""
        within = self._scope.within
        return [i for i in sorted(self.cards) if within is None or i in within]

    def _catalog_project(self, project: str, klass: str) -> str:
        """An on-demand booking's project: its catalog entry's, which the runner's account need not be a member of;
        a project's own classes still hold."""
        if bool(self.config.projects) != (projects.named(self.config, project) is not None):
            known = ", ".join(p.name for p in self.config.projects) or "none"
            raise BadInput(f"no project {project!r} for the catalog's booking; the projects are {known}")
        if reason := projects.class_refusal(self.config, project, klass):
            raise NotPermitted(reason)
        return project

    def _period_bookings(self, start: int, end: int) -> list[Booking]:
        if self._periods is None:
            return rows.live_between(self.conn, start, end)
        if (start, end) not in self._periods:
            self._periods[start, end] = rows.live_between(self.conn, start, end)
        return self._periods[start, end]

    def _opens(self, klass: str, start: int, end: int, project: str) -> list[int]:
        """Besides booking ends, the starts in [start, end) where a refusal can turn into a yes: where a pool's window
        opens or an allocation closes (policy.window_opens), and where `project`'s budget resets (its hours come
        back); in order."""
        opens = policy.window_opens(self.config, klass, start, end)
        if (budgeted := projects.named(self.config, project)) is not None and budgeted.gpu_hours is not None:
            opens += projects.resets(budgeted, start, end - 1, policy.policy_zone(self.config))  # (start, end)
        return sorted(opens)

    def earliest_words(self, search: dict[str, Any]) -> str:
        """A refusal's second half, for its search (`_retry`'s: the `earliest` operation's arguments): the earliest
        start that works, or that none does."""
        cards = self._check_cards(search["cards"]) if search.get("cards") is not None else None
        count = search.get("count")
        if cards is None and count not in GROUP_SIZES:
            raise BadInput(f"a group is 1, 2, 4 or 8 cards, not {count}")
        klass = self._check_class(search.get("class", "experiment"))
        # The search's project as a booking's: only one its holder is in (another's allocation is not theirs to try).
        project = self._check_project(search.get("project"), klass, search.get("user"))
        found = self._earliest(cards=cards, count=count, klass=klass, start=search["start"],
                               duration=search["duration"], excluding=search.get("excluding"), user=search.get("user"),
                               project=project)
        now = self.clock()
        if found is None:
            return f"no start within {self.config.policy.max_ahead_days:g} days works either"
        if cards is not None:
            return f"next free start for cards {format_cards(found.cards)}: {stamp_when(found.start, now)}"
        said = f"{'card' if len(found.cards) == 1 else 'cards'} {format_cards(found.cards)}"
        return f"the earliest start that works: {stamp_when(found.start, now)} on {said} (--or-later takes it)"

    def options(self, count: int, klass: str, start: int, duration: int, limit: int = 3,
                project: str | None = None) -> list[tuple[Plan, int | None]]:
        """The earliest slots, each on a different group of `count` cards, where every rule lets a `klass`
        booking of `duration` start; with each, when its cards stop being free (None: not within a day
        past the slot). Candidate starts are `start`, each moment a booking on some card ends, and each
        moment `_opens` names."""
        self._check_access(self._check_class(klass))
        chosen = self._check_project(project, klass)
        if count not in GROUP_SIZES:
            raise BadInput(f"a group is 1, 2, 4 or 8 cards, not {count}")
        now = int(self.clock())
        horizon = start + int(self.config.policy.max_ahead_days * 86400)
        ends = sorted({b.end for b in rows.live_between(self.conn, start, horizon) if b.end > start})[:MAX_CANDIDATES]
        opens = self._opens(klass, start, horizon + 1, chosen)[:MAX_CANDIDATES]  # a start may be at the horizon
        found: list[tuple[Plan, int | None]] = []
        with self._searching():
            for candidate in sorted({start, *ends, *opens}):
                if len(found) == limit:
                    break
                try:
                    policy.check_span(self.config, start=candidate, end=candidate + duration, now=now)
                    plan = self._plan_at(None, count, klass, candidate, duration, now, None, project=chosen)
                except (Conflict, NotPermitted):
                    continue
                busy = self._busy_by_index(plan.end, plan.end + LOOKAHEAD_SECONDS, None)
                starts = [begin for i in plan.cards for begin, _ in busy.get(i, ()) if begin >= plan.end]
                # A later slot on cards already offered adds nothing unless the earlier one was cut short.
                if not any(plan.cards == seen.cards and (until is None or plan.start < until) for seen, until in found):
                    found.append((plan, min(starts) if starts else None))
        return found

    def next_free(self, cards: Sequence[int], start: int, duration: int, excluding: int | None = None,
                  klass: str = "experiment", project: str | None = None) -> int | None:
        """The earliest start at or after `start` where `cards` are free for `duration` and the rules let
        the caller book them; None when none is, within how far ahead a booking may start."""
        self._check_access(self._check_class(klass))
        chosen = self._check_project(project, klass)
        found = self._earliest(cards=self._check_cards(cards), count=None, klass=klass, start=start,
                               duration=duration, excluding=excluding, project=chosen)
        return found.start if found is not None else None

    # -- changes -------------------------------------------------------------------------------

    def create(self, **kwargs: Any) -> Booking:
        """Book (see `book`), without the notes."""
        return self.book(**kwargs)[0]

    @_worded
    def book(
        self,
        *,
        cards: Sequence[int] | None = None,
        count: int | None = None,
        start: int,
        end: int,
        klass: str = "experiment",
        note: str = "",
        request: dict[str, Any] | None = None,
        or_later: bool = False,
        force: bool = False,
        project: str | None = None,
        on_demand: str = "",
        within: Sequence[int] | None = None,
    ) -> tuple[Booking, tuple[str, ...]]:
        """Create a booking; also returns the notes on what runs on the cards now (Plan.notes).

        `or_later`: take the earliest start from `start` on that works, and join the queue: the booking
        moves earlier by itself when time frees up (`backfill`). `force`: named cards on a host that is down
        (`_host_down`), or an admin's booking past its project's budget. `project`: --project.

        `on_demand`: the catalog alias ([[models]]) the booking is made for (app.service.ops.models): its request
        says so, and its note. It is exempt from the rules about people ([classes] access, project membership, cards
        at once, the longest booking, how far ahead: the catalog is the admin's, and its span grows by `lease`), and
        keeps the pools' rules, other projects' allocations and its project's budget. `within`: the cards a count
        takes its group from (a pool's)."""
        if (request or {}).get("on_demand") and not on_demand:
            raise BadInput("a request's on_demand is the service's to set (app.service.ops.models)")
        if on_demand:
            request, note = {**(request or {}), "on_demand": on_demand}, f"on demand: {on_demand}"
        note = self._check_note(note)
        details: dict[str, Any] = {"cards": list(cards) if cards is not None else None, "count": count, "start": start,
                                   "end": end, "class": klass, "note": note}
        if project:
            details["project"] = project
        if or_later:
            details["or_later"] = True
        if force:
            details["force"] = True
        if on_demand:
            details["on_demand"] = on_demand
        if within is not None:
            details["within"] = sorted(set(within))

        # A count, or a start that may move, is planned on a plain read first, outside the write lock;
        # inside it the plan is only re-checked like explicit cards at a fixed start, and re-planned if
        # someone took them meanwhile. The store's sole writer has no one to keep waiting: it plans once, inside.
        # A pool's cards, as they are: a lost one is passed over like any card a count will not take, not refused.
        scope = _Scope(bool(on_demand), frozenset(within) if within is not None else None)
        hint = None
        if (cards is None or or_later) and not self.sole_writer:
            try:
                with self._planning(scope):
                    hint = self._plan(cards=cards, count=count, start=start, end=end, klass=klass, or_later=or_later,
                                      force=force, project=project)
            except BoardError:
                pass  # the planning inside the lock raises it again, and audits it

        notes: tuple[str, ...] = ()

        def change(now: int) -> int:
            nonlocal notes
            plan = None
            with self._planning(scope):
                if hint is not None:
                    try:
                        plan = self._plan(cards=hint.cards, start=hint.start, end=hint.end, klass=klass, force=force,
                                          project=project)
                        notes = hint.notes  # why the count picked these cards
                    except Conflict:
                        pass
                if plan is None:
                    plan = self._plan(cards=cards, count=count, start=start, end=end, klass=klass, or_later=or_later,
                                      force=force, project=project)
                    notes = plan.notes
                cut = self._make_way(plan.cards, plan.start, plan.end, now)  # written first: the overlap backstops
            rows.sync_cards(self.conn, self.cards.values(), now, self.host)
            wanted = min(max(start, now), plan.start)
            booking_id = rows.insert(
                self.conn, user=self.me.name, uid=self.me.uid, uuids=plan.uuids, start=plan.start, end=plan.end,
                klass=klass, note=note, request=request, now=now, created_by=self.me.uid, requested_at=wanted,
                # It waits only if it starts later than asked: a booking never moves earlier than that.
                queued=("cards" if cards is None else "time") if or_later and plan.start > wanted else None,
                project=plan.project,
            )
            self._yielded(cut, booking_id, now)
            details.update(cards=list(plan.cards), start=plan.start, end=plan.end)
            if plan.project:
                details["project"] = plan.project
            if plan.over_budget:
                details["over_budget"] = plan.over_budget
            return booking_id

        # Cards named: on PostgreSQL the write locks only them and the caller's limits, so bookings on other cards
        # run alongside (app.store.db.write); cards the rules pick, from any of them, lock the whole store.
        uuids = tuple(self.cards[i].uuid for i in cards if i in self.cards) if cards is not None else ()
        if self._budgeted(project):
            uuids = ()  # a budget is read across the project's bookings on any card: the whole store is locked
        # The span its rules ask about: the one asked, and the one the plan outside the lock found.
        reads = (min(start, hint.start), max(end, hint.end)) if hint is not None else (start, end)
        return self._audited("create", None, details, change, cards=uuids, user=self.me.name, new_booking=True,
                             reads=reads), notes

    def cancel(self, booking_id: int) -> Booking:
        def change(now: int) -> int:
            booking = self._editable(booking_id, "cancel", now)
            self._end_now(booking, now)
            self._tell(booking, f"cancelled by admin {self.me.name}")
            return booking_id

        return self._audited("cancel", booking_id, {}, change)

    def release(self, booking_id: int) -> Booking:
        def change(now: int) -> int:
            booking = self._editable(booking_id, "release", now)
            if booking.start > now:
                raise BadInput(f"booking {booking_id} has not started yet; cancel it instead")
            self._end_now(booking, now)
            self._tell(booking, f"released by admin {self.me.name}")
            return booking_id

        return self._audited("release", booking_id, {}, change)

    def extend(self, booking_id: int, end: int) -> Booking:
        details = {"end": end}

        def change(now: int) -> int:
            booking = self._editable(booking_id, "extend", now)
            if end <= booking.end:
                raise BadInput(f"the new end must be after the current end {stamp_when(booking.end, now)}")
            with self._planning(_Scope(on_demand=bool(booking.on_demand))):
                self._check_free(booking.cards, booking.end, end, excluding=booking_id)
                cut = self._make_way(booking.cards, booking.end, end, now, excluding=booking_id)
            held = [(b.start, b.end, len(b.cards))
                    for b in rows.live_between(self.conn, booking.start, end, user=booking.user) if b.id != booking_id]
            policy.check(self.config, cards=booking.cards, klass=booking.klass, start=booking.start, end=end,
                         now=min(now, booking.start), held=held, project=booking.project)
            self._check_budget(booking.project, [(booking.start, end)], len(booking.cards), booking_id)
            details["old_end"] = booking.end
            rows.set_times(self.conn, booking_id, booking.start, end)
            self._yielded(cut, booking_id, now)
            self._tell(booking, f"extended to {stamp_time(end, now)} by admin {self.me.name}")
            return booking_id

        return self._audited("extend", booking_id, details, change)

    def lease(self, booking_id: int, end: int) -> Booking:
        """Keep an on-demand booking's cards until `end`: its end moves there, but never past the start of the next
        other booking on its cards less YIELD_GAP_SECONDS, nor past what the pools' windows, other projects'
        allocations and its project's budget allow (`_allowed_until`), and never earlier than it is. Not audited: the
        gateway's use leases every few seconds; a move of under LEASE_MIN_STEP_SECONDS (a quarter of a shorter lease)
        writes nothing. A booking that
        has ended or was cancelled comes back as it is: a lease does not revive it."""
        with write(self.conn):
            now = int(self.clock())
            booking = self.get(booking_id)
            if not booking.on_demand:
                raise BadInput(f"booking {booking_id} is not on demand; 'board extend' extends it")
            if booking.status != "booked" or booking.end <= now:
                return booking
            with self._planning(_Scope(on_demand=True)):  # on-demand bookings block each other
                busy = self._busy_by_index(booking.end, end + YIELD_GAP_SECONDS, booking_id)
            after = [first for i in booking.cards for first, _ in busy.get(i, ()) if first >= booking.end]
            until = self._allowed_until(booking, min([end, *(first - YIELD_GAP_SECONDS for first in after)]))
            # A short lease (ttl_s + drain_s of a few seconds) moves in steps of a quarter of itself, or it never would
            if until - booking.end < min(LEASE_MIN_STEP_SECONDS, max(1, (end - now) // 4)):
                return booking
            rows.set_times(self.conn, booking_id, booking.start, until)
        return self.get(booking_id)

    def _allowed_until(self, booking: Booking, until: int) -> int:
        """The latest end up to `until` (and from the booking's own on) at which the rules an on-demand booking keeps
        still take it: its cards' pools and allocations (card_refusal), its project's budget. Each refuses more of a
        longer span, so the search halves the difference."""
        def allowed(end: int) -> bool:
            if any(policy.card_refusal(self.config, i, booking.klass, booking.start, end, project=booking.project)
                   for i in booking.cards):
                return False
            try:
                self._check_budget(booking.project, [(booking.start, end)], len(booking.cards), booking.id)
            except NotPermitted:
                return False
            return True

        low, high = booking.end, until
        with self._searching():
            if high <= low or allowed(high):
                return high
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if allowed(middle) else (low, middle)
        return low

    def move(self, booking_id: int, start: int, end: int, override_policy: bool = False) -> Booking:
        """Give a booking new times on the same cards; admins only. The rules apply unless `override_policy`,
        which the audit event records. A booking that has started keeps its start: only its end moves."""
        details: dict[str, Any] = {"start": start, "end": end}
        if override_policy:
            details["override_policy"] = True

        def change(now: int) -> int:
            if not self.me.is_admin:
                raise NotPermitted(f"only admins (group {self.config.admin_group}) can move bookings")
            booking = self._editable(booking_id, "move", now)
            if booking.start <= now and start != booking.start:
                raise BadInput(f"booking {booking_id} started at {stamp_time(booking.start, now)}; only its end can"
                               " move (--until), or reassign it")
            if booking.start > now and start < now - PAST_GRACE_SECONDS:
                raise BadInput(f"the start {stamp_time(start, now)} is in the past; pick a start from now on")
            if end <= max(start, now):
                raise BadInput(f"the end {stamp_when(end, now)} must be after the start {stamp_when(start, now)}"
                               " and after now")
            with self._planning(_Scope(on_demand=bool(booking.on_demand))):
                self._check_free(booking.cards, start, end, excluding=booking_id)
            if not override_policy:
                held = [(b.start, b.end, len(b.cards))
                        for b in rows.live_between(self.conn, start, end, user=booking.user) if b.id != booking_id]
                policy.check(self.config, cards=booking.cards, klass=booking.klass, start=start, end=end,
                             now=min(now, start), held=held, project=booking.project)
                self._check_budget(booking.project, [(start, end)], len(booking.cards), booking_id)
            details.update(old_start=booking.start, old_end=booking.end)
            with self._planning(_Scope(on_demand=bool(booking.on_demand))):
                cut = self._make_way(booking.cards, start, end, now, excluding=booking_id)
            rows.set_times(self.conn, booking_id, start, end)
            self._yielded(cut, booking_id, now)
            if booking.queued:  # an admin set its time: the backfill must not move it back
                rows.set_queued(self.conn, booking_id, None)
            self._tell(booking, f"moved from {stamp_time(booking.start, now)}-{stamp_time(booking.end, now)} to "
                                f"{stamp_time(start, now)}-{stamp_time(end, now)} by admin {self.me.name}")
            return booking_id

        return self._audited("move", booking_id, details, change)

    @_worded
    def reassign(
        self, booking_id: int, *, cards: Sequence[int] | None = None, user: str | None = None, force: bool = False
    ) -> Booking:
        """Move a booking to other cards and/or give it to another user; admins only.

        The past is never rewritten. A booking that has started and changes cards is split at now: the
        original keeps its cards and ends now, as history, and the rest becomes a new booking (same
        user unless `user` says otherwise, same class, note and request) on the new cards. That new
        piece is what is returned; the audit event sits on the original id and names both. A booking
        that has not started moves whole and keeps its id, as does a change of user alone.

        Neither cards nor holder change under running work: live servers or jobs (`_running`) refuse it unless
        `force`. Forced, a started booking is split even for a new holder alone: the original ends at now, so
        the service's enforcement stops them, and no server of the old holder's serves on the new holder's
        booking. A server planned on the booking by someone other than the new holder (its author; the plan
        would start it as them) refuses a new holder too; forced, the plan no longer starts it (a booking's
        own plan is cancelled, a series' plan skips this occurrence).
        """
        details: dict[str, Any] = {"cards": list(cards) if cards is not None else None, "user": user}

        def change(now: int) -> int:
            if not self.me.is_admin:
                raise NotPermitted(f"only admins (group {self.config.admin_group}) can reassign bookings")
            booking = self._editable(booking_id, "reassign", now)
            details.update(old_cards=list(booking.cards), old_user=booking.user)
            owner = (booking.user, booking.uid)
            if user is not None:
                found = self.users(user)
                if found is None:
                    raise BadInput(f"no user {user!r} on this server")
                owner = found
                details["user"] = owner[0]
                self._check_access(booking.klass, owner[0])  # the new holder may hold its class ([classes])
                if (project := projects.named(self.config, booking.project)) and project not in projects.of(
                        self.config, owner[0]):
                    raise NotPermitted(f"{owner[0]} is not a member of project {project.name}, which booking"
                                       f" {booking_id} is for; give it to a member ({', '.join(project.members)})")
            chosen = booking.cards
            if cards is not None:
                chosen = self._check_cards(cards)
                if len(chosen) != len(booking.cards):
                    raise BadInput(f"booking {booking_id} has {len(booking.cards)} card(s); give as many")
                details["cards"] = list(chosen)
                begin = max(booking.start, now)
                if reason := projects.allocation_refusal(self.config, booking.project, chosen, begin, booking.end,
                                                         policy.policy_zone(self.config)):
                    raise NotPermitted(reason)
            moving, giving = chosen != booking.cards, owner != (booking.user, booking.uid)
            running = self._running(booking_id) if moving or giving else []
            doing = "move the booking" if moving else f"give the booking to {owner[0]}"
            if running and not force:
                them = "it" if len(running) == 1 else "them"
                raise Conflict(
                    f"booking {booking_id} has {', '.join(running)} running on cards {format_cards(booking.cards)};"
                    f" stop {them} first, or pass --force to stop {them} and {doing}"
                )
            if running:
                details["stopped"] = running
            # A plan starts its server as its author: on someone else's booking it must not start at all.
            from app.store import plans as plan_rows  # start-up: only a reassign reads plans (not the quick book)

            planned = [p for p in plan_rows.pending_for(self.conn, booking_id) if p.uid != owner[1]] if giving else []
            if planned and not force:
                them = "it" if len(planned) == 1 else "them"
                raise Conflict(
                    f"booking {booking_id} has {', '.join(f'planned server {p.id} ({p.user})' for p in planned)};"
                    f" cancel {them} first (board serve plan --cancel {planned[0].id}), or pass --force to cancel"
                    f" {them} and {doing}"
                )
            cut: list[int] = []
            if moving:
                begin = max(booking.start, now)
                with self._planning(_Scope(on_demand=bool(booking.on_demand))):
                    try:
                        self._check_free(chosen, begin, booking.end, excluding=booking_id)
                    except SlotTaken as taken:
                        raise _retry(taken, cards=chosen, count=None, klass=booking.klass, start=begin,
                                     duration=booking.end - begin, excluding=booking_id) from None
                    cut = self._make_way(chosen, begin, booking.end, now, excluding=booking_id)
            what = " and ".join(
                ([f"moved to {cards_text(chosen)}"] if moving else [])
                + ([f"given to {owner[0]}"] if giving else [])) + f" by admin {self.me.name}"
            for plan in planned:  # forced
                if plan.booking_id == booking_id:
                    plan_rows.cancel(self.conn, plan.id, now)
                else:  # a series' plan: this occurrence counts as run, with why it did not start
                    plan_rows.record_run(self.conn, plan.id, booking_id, now, error=f"booking given to {owner[0]}")
                what += f"; planned server {plan.id} ({plan.user}) will not start on it"
            if planned:
                details["plans_dropped"] = [p.id for p in planned]
            result = booking_id
            # Forced over running work, a started booking splits even on its cards: the work stops with the piece that
            # ends now.
            if moving or (running and booking.start < now):
                rows.sync_cards(self.conn, self.cards.values(), now, self.host)
                uuids = [self.cards[i].uuid for i in chosen]
                if booking.start < now:
                    rows.set_times(self.conn, booking_id, booking.start, now)  # first: the pieces meet at now
                    result = rows.insert(
                        self.conn, user=owner[0], uid=owner[1], uuids=uuids, start=now, end=booking.end,
                        klass=booking.klass, note=booking.note, request=booking.request, now=now,
                        created_by=self.me.uid, requested_at=now,  # it carries on from now: no wait to count
                        project=booking.project,
                    )
                    details.update(split_at=now, from_booking=booking_id, to_booking=result)
                    what += f" (from now on booking {result})"
                else:
                    rows.set_cards(self.conn, booking_id, uuids)
            self._yielded(cut, result, now)
            if giving and result == booking_id:
                rows.set_owner(self.conn, booking_id, *owner)
            self._tell(booking, what, also=(result, owner[1]))
            return result

        return self._audited("reassign", booking_id, details, change)

    def backfill(self) -> list[tuple[Booking, Booking]]:
        """Move queued bookings earlier where time has freed up, in one transaction; returns (before, after) pairs.

        Bookings that asked to move (`queued`) and have not started are taken in class order (online first),
        then by fair share (core.fairshare), then when wanted from, then by id; each moves to the earliest start that
        every rule accepts for its holder, from when it was wanted on, if that is earlier than its start. A booking
        queued on its cards ('time') keeps them; one queued for a count ('cards') may take any group of as
        many. No booking moves later, and none that did not ask to. Each move is audited (actor "board")
        and told to its holder."""
        moved: list[tuple[Booking, Booking]] = []
        with write(self.conn):
            now = int(self.clock())
            # A move frees the slot it left, which may let one earlier in the order move again: until none does.
            freed: list[tuple[Booking, int]] | None = None
            for _ in range(MAX_BACKFILL_ROUNDS):
                found = self._backfill_round(now, freed)
                moved += found
                if not found:
                    break
                freed = [(before, before.start) for before, _ in found]
        return moved

    def _backfill_round(self, now: int, freed: list[tuple[Booking, int]] | None) -> list[tuple[Booking, Booking]]:
        """One pass over the queue in its order. After the first, `freed` is each move of the last pass: (the booking
        as it was, the start it left). Only a booking before that move in the order (those after it were asked
        with the time already free) and ending after the start it left (it cannot reach the time otherwise) may
        move again, so the pass that finds nothing more costs little."""
        moved: list[tuple[Booking, Booking]] = []
        waiting, standing = self._queue(now)
        if freed is not None:
            order = functools.partial(fairshare.queue_order, standing=standing)
            left = [(order(before), start) for before, start in freed]  # each once: the queue may be long
            waiting = [b for key, b in ((order(b), b) for b in waiting)
                       if any(place > key and start < b.end for place, start in left)]
        for booking in waiting:
            wanted = max(now, booking.requested_at)
            if booking.start <= wanted or booking.host not in ("", self.host):
                continue  # not earlier, or on another host's cards: that host's service moves it
            holder = BookingService(self.conn, Identity(booking.user, booking.uid, False), self.config,
                                    list(self.cards.values()), self.topology, self.clock, self.jobs, host=self.host)
            cards = tuple(booking.cards) if booking.queued == "time" else None
            if cards is not None and any(i not in self.cards for i in cards):
                continue  # its cards are not in this view of the fleet: leave it be
            plan = holder._earliest(cards=cards, count=None if cards else len(booking.cards), klass=booking.klass,
                                    start=wanted, duration=booking.end - booking.start, excluding=booking.id,
                                    project=booking.project)
            if plan is None or plan.start >= booking.start:
                continue
            cut = holder._make_way(plan.cards, plan.start, plan.end, now, excluding=booking.id)
            if plan.cards != booking.cards:  # off the old cards first: they may be taken at the new time
                rows.sync_cards(self.conn, self.cards.values(), now, self.host)
                rows.set_cards(self.conn, booking.id, ())
            rows.set_times(self.conn, booking.id, plan.start, plan.end)
            if plan.cards != booking.cards:
                rows.set_cards(self.conn, booking.id, plan.uuids)
            what = f"moved up from {stamp_time(booking.start, now)} by backfill"
            rows.set_notice(self.conn, booking.id, what)
            events.record(self.conn, ts=now, uid=os.getuid(), actor="board", action="backfill", booking_id=booking.id,
                          ok=True, details={"old_start": booking.start, "old_cards": list(booking.cards),
                                            "start": plan.start, "end": plan.end, "cards": list(plan.cards)})
            self._yielded(cut, booking.id, now, actor=(os.getuid(), "board"))
            after = self.get(booking.id)
            self.told.append((booking.uid, f"booking {booking.id} was {what}: now {stamp_when(plan.start, now)}"
                                            f" on cards {format_cards(plan.cards)}"))
            moved.append((booking, after))
        return moved

    def _queue(self, now: int) -> tuple[list[Booking], dict[str, float]]:
        """The waiting bookings in the queue's order, and each project's standing (one read of the past use, and only
        on a board with [[projects]] and a queue): what a backfill round and `queue_place` go by."""
        waiting = rows.queued(self.conn, now)
        past = rows.card_spans(self.conn, fairshare.lookback(self.config, now), now) \
            if waiting and self.config.projects else []
        standing = fairshare.standings(self.config, past, now)
        return sorted(waiting, key=functools.partial(fairshare.queue_order, standing=standing)), standing

    def queue_places(self, bookings: Sequence[Booking]) -> dict[int, str]:
        """Where each waiting booking of `bookings` is in its queue and why (`board wait`, `board list`), by id: one
        read of the queue, none where none of them waits."""
        now = int(self.clock())
        asked = {b.id for b in bookings if b.queued and b.status == "booked" and b.start > max(now, b.requested_at)}
        if not asked:
            return {}
        queue, standing = self._queue(now)
        waiting = [b for b in queue if b.start > max(now, b.requested_at)]  # at its asked start: it waits for nothing
        return {b.id: fairshare.place(b, waiting, standing, self.config) for b in waiting if b.id in asked}

    # -- helpers -------------------------------------------------------------------------------

    def _tell(self, booking: Booking, what: str, also: tuple[int, int] | None = None) -> None:
        """Leave `what` ("moved up from 15:00 by backfill") on a booking someone else changed, for its holder
        (and, with `also` = (booking id, uid), on the piece or new holder a change made); the service
        publishes `told` once the change is committed."""
        targets = {(booking.id, booking.uid)} | ({also} if also else set())
        if all(uid == self.me.uid for _, uid in targets):
            return
        for booking_id in {booking_id for booking_id, _ in targets}:
            rows.set_notice(self.conn, booking_id, what)
        for uid in {uid for _, uid in targets}:
            self.told.append((uid, f"booking {booking.id} was {what}"))


    def _audited(self, action: str, booking_id: int | None, details: dict, change: Callable[[int], int],
                 **locks: Any) -> Booking:
        """`audited` for a change to one booking, which it returns: the event is filed under `booking_id` when
        given (the booking acted on), else under the one `change` returns (a new booking)."""
        result_id = self.audited(action, details, change,
                                 filed_under=lambda made: made if booking_id is None else booking_id, **locks)
        return self.get(result_id)

    def audited(self, action: str, details: dict, change: Callable[[int], T],
                filed_under: Callable[[T | None], int | None] = lambda _: None,
                cards: Sequence[str] = (), user: str | None = None, new_booking: bool = False,
                reads: tuple[int, int] | None = None) -> T:
        """Run `change(now)` and its audit event in one transaction; a refusal by rule is audited in the same one.

        Refusals by rule (Conflict, NotPermitted) roll `change` back, are audited with the rule that refused,
        and are raised again; bad input writes nothing. The event is filed under the booking id
        `filed_under` gives for the result (None after a refusal). `cards` and `user`: all that `change` reads
        and changes, when it is only those cards' bookings and that user's limits (app.store.db.write).
        `new_booking`: `change` may insert a booking (app.store.db.write's: on PostgreSQL it goes with the COMMIT).
        `reads`: the span (start, end) that `change` asks about those cards' bookings and that user's (app.store.db.write's:
        on PostgreSQL they are read with the locks).
        """
        now = int(self.clock())
        refusal: BoardError | None = None
        result: T | None = None
        try:
            with write(self.conn, cards=cards, user=user, savepoint="attempt", new_booking=new_booking, reads=reads):
                try:
                    result = change(now)
                except (Conflict, NotPermitted) as refused:
                    self.conn.execute("ROLLBACK TO attempt")
                    rows.rolled_back(self.conn)
                    refusal, details = refused, {**details, "refused": str(refused), "refused_by": refused_by(refused)}
                events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action=action,
                              booking_id=filed_under(result), ok=refusal is None, details=details)
        except sqlite3.IntegrityError as error:
            if not str(error).startswith("overlapping booking"):
                raise  # not a race for the cards (the audit log refused its event): the database's words say what
            # The overlap triggers (SQLite) or the EXCLUDE (PostgreSQL): another writer beat us past our own check.
            raise Conflict(f"the cards were just booked by someone else; try again ({error})") from None
        if refusal is not None:
            raise refusal
        return cast(T, result)  # no refusal: change(now) returned it

    def _running(self, booking_id: int) -> list[str]:
        """What runs on the booking's cards and would lose them if it moved, for people: 'server 3', 'job 4711'."""
        return ([f"server {server_id}" for server_id in rows.live_server_ids(self.conn, booking_id)]
                + [f"job {pid}" for pid in self.jobs(booking_id)])

    def _end_now(self, booking: Booking, now: int) -> None:
        """A booking that has run keeps its past as history; one that has not is simply cancelled."""
        if booking.start < now:
            rows.set_times(self.conn, booking.id, booking.start, now)
        else:
            rows.set_cancelled(self.conn, booking.id)

    def _editable(self, booking_id: int, verb: str, now: int) -> Booking:
        booking = self.get(booking_id)
        if booking.uid != self.me.uid and not self.me.is_admin:
            raise NotPermitted(f"booking {booking_id} belongs to {booking.user}; only they or an admin can {verb} it")
        if booking.status == "cancelled":
            raise BadInput(f"booking {booking_id} is cancelled")
        if booking.end <= now:
            raise BadInput(f"booking {booking_id} has already ended; past bookings cannot change")
        return booking

    def _check_class(self, klass: str) -> str:
        if klass not in CLASSES:
            raise BadInput(f"unknown class {klass!r}; use one of {', '.join(CLASSES)}")
        return klass

    def _check_access(self, klass: str, holder: str | None = None) -> None:
        """NotPermitted, naming who may, when the holder (default the caller) may not use `klass` ([classes])."""
        if reason := policy.class_refusal(self.config, klass, holder or self.me.name):
            raise NotPermitted(reason)

    def _check_project(self, asked: str | None, klass: str, holder: str | None = None) -> str:
        """The project a booking is for (app.core.projects.choose), refused when it may not use `klass`."""
        project = projects.choose(self.config, holder or self.me.name, asked)
        if reason := projects.class_refusal(self.config, project, klass):
            raise NotPermitted(reason)
        return project

    def _budgeted(self, project: str | None) -> bool:
        """Whether a booking for `project` (None: the holder's only one) is held to a budget: the check reads every
        booking of its project."""
        return any(p.gpu_hours is not None and project in (None, p.name) for p in self.config.projects)

    def _check_budget(self, project: str, spans: Sequence[tuple[int, int]], count: int, excluding: int | None,
                      over: bool = False, what: str = "booking") -> str | None:
        """NotPermitted when `count` cards over `spans` (a booking's one, a series' occurrences together) would take
        `project` past its GPU-hour budget in a period they meet; `over` (an admin's --force) lets it pass, and the
        note returned says by how much. Used: booked hours before now; booked ahead: from now to the reset."""
        found = projects.named(self.config, project)
        if found is None or found.gpu_hours is None or not spans:
            return None
        tz = policy.policy_zone(self.config)
        now = int(self.clock())
        budget = found.gpu_hours * 3600
        at, last = min(start for start, _ in spans), max(end for _, end in spans)
        while at < last:  # each period the spans meet, on its own budget
            first, reset = projects.period(found, at, tz)
            wanted = sum(max(0, min(end, reset) - max(start, first)) for start, end in spans) * count
            at = max(reset, at + 1)  # always forward, whatever a period's arithmetic says
            if not wanted:
                continue
            others = [b for b in self._period_bookings(first, reset) if b.id != excluding]
            used, ahead = projects.spent(others, project, first, reset, now)
            if used + ahead + wanted > budget:
                words = (f"project {project}'s budget is {found.gpu_hours:g} GPU-hours a {found.period}:"
                         f" {used / 3600:.1f} h used and {ahead / 3600:.1f} h booked ahead, this {what} needs"
                         f" {wanted / 3600:.1f} h; it resets {stamp_when(reset, now)}")
                if not over:
                    raise NotPermitted(f"{words}; book less, or ask an admin")
                return f"{OVER_BUDGET}{words}"
        return None

    def _check_note(self, note: str) -> str:
        if len(note) > MAX_NOTE_CHARS:
            raise BadInput(f"the note is {len(note)} characters; keep it to {MAX_NOTE_CHARS}")
        try:
            note.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: SQLite cannot store them, so refuse before any write
            raise BadInput("the note is not valid UTF-8 text; retype it") from None
        return note

    def _check_cards(self, cards: Sequence[int]) -> tuple[int, ...]:
        chosen = tuple(sorted(set(cards)))
        if not chosen:
            raise BadInput("name at least one card")
        for index in chosen:
            if index not in self.cards:
                known = f"{min(self.cards)}-{max(self.cards)}" if self.cards else "none"
                raise BadInput(f"unknown card {index}; the cards are {known}")
            if self.cards[index].lost:
                raise NotPermitted(f"card {index} is lost (fell off the bus); pick another card")
        return chosen

    def _pick(
        self, count: int, klass: str, start: int, duration: int, now: int, now_slot: bool, excluding: int | None,
        busy: dict | None, project: str = projects.IMPLICIT, yielding: dict | None = None,
    ) -> tuple[tuple[int, ...], list[str]]:
        """The best-connected `count` cards free at exactly `start`, and notes on the cards passed over.

        Too few cards that the pools allow is a refusal by rule, naming each rule; too few of those free
        is a conflict, naming who holds them. A slot that starts now leaves out cards with another
        user's processes, and HOT cards while a cooler group is free. A group that cuts no on-demand booking short
        (`yielding`: theirs, by card) is taken first whenever there is one."""
        end = start + duration
        refusals = {i: f"card {i} is lost (fell off the bus)" if self.cards[i].lost
                    else policy.card_refusal(self.config, i, klass, start, end, project=project)
                    for i in sorted(self._candidates())}
        eligible = [i for i, reason in refusals.items() if reason is None]
        if len(eligible) < count:
            reasons = "; ".join(dict.fromkeys(reason for reason in refusals.values() if reason is not None))
            raise NotPermitted(f"{count} {'card' if count == 1 else 'cards'} for a {format_duration(duration)} {klass}"
                               f" booking from {stamp_when(start, now)}: the rules allow {len(eligible) or 'none'}:"
                               f" {reasons}")
        others = self._others_now(now) if now_slot else {}
        foreign = {i: others[i] for i in eligible if i in others}
        searching = busy is not None
        if busy is None:
            busy = self._busy_by_index(start, end, excluding)
        free = [i for i in eligible if i not in foreign and is_free(busy, (i,), (start, end))]
        cool = [i for i in free if not (now_slot and self._hot(i))]
        if self._scope.on_demand:
            clear = free  # it sees every booking: none of the free cards holds one
        else:
            if yielding is None:
                yielding = self._busy_by_index(start, end, excluding, yielding=True)
            clear = [i for i in free if is_free(yielding, (i,), (start, end))]
        chosen = next((group for cards in ([i for i in cool if i in clear], clear, cool, free)
                       if (group := best_group(cards, count, self.topology))), None)
        why = {i: self._whose(procs) for i, procs in foreign.items() if is_free(busy, (i,), (start, end))}
        # A LOST card the rules would otherwise take is passed over too, and said so.
        why.update({i: "LOST: fell off the bus" for i in self._candidates() if self.cards[i].lost
                    and is_free(busy, (i,), (start, end))
                    and policy.card_refusal(self.config, i, klass, start, end, project=project) is None})
        passed = [f"card {i} ({why[i]})" for i in sorted(why)]
        if chosen is None:
            if searching:
                raise Conflict("taken")
            raise self._no_group(count, klass, start, end, [i for i in eligible if i not in free], passed, excluding)
        why.update({i: f"{self.cards[i].temperature_c} °C" for i in free if i not in cool and i not in chosen})
        notes = [f"passed over {', '.join(f'card {i} ({why[i]})' for i in sorted(why))}"] if why else []
        cooler = " free of on-demand models" if best_group(cool, count, self.topology) else ""
        notes += [f"took card {i} though it is HOT ({self.cards[i].temperature_c} °C): no cooler group{cooler}"
                  " could start then" for i in chosen if i not in cool]
        return chosen, notes

    def _no_group(self, count: int, klass: str, start: int, end: int, taken: list[int], passed: list[str],
                  excluding: int | None) -> Conflict:
        """Too few free cards at the start: who holds the ones that are taken, and until when."""
        now = self.clock()
        uuids = {self.cards[i].uuid for i in taken}
        holders = [f"{'card' if len(cards) == 1 else 'cards'} {format_cards(cards)} {'is' if len(cards) == 1 else 'are'}"
                   f" booked by {b.user} {held(b, now)} (booking {b.id})"
                   for b in rows.live_between(self.conn, start, end, on_demand=self._seen()) if b.id != excluding
                   if (cards := sorted(self.by_uuid[u] for u in b.card_uuids if u in uuids))]
        why = holders[:3] + (["…"] if len(holders) > 3 else []) + ([f"passed over {', '.join(passed)}"] if passed else [])
        return Conflict(f"no {'card is' if count == 1 else f'{count} cards are'} free for"
                        f" {'an' if klass[0] in 'aeiou' else 'a'} {klass} booking"
                        f" at {stamp_when(start, now)}"
                        + (f": {'; '.join(why)}" if why else ""))

    def _others_now(self, now: int) -> dict[int, list[GpuProcess]]:
        """Each card's processes of someone else's right now. Worked out once for `now`: a search for the
        earliest start asks at every candidate, and a backfill searches for each queued booking."""
        if self._others is None or self._others[0] != now:
            mine, serving = self._held_now(now), self._serving_now(now)
            self._others = (now, {i: found for i, card in self.cards.items()
                                  if (found := [p for p in self._foreign(card, i in mine)
                                                if (p.uid if p.uid is not None else p.user) not in serving.get(i, ())])})
        return self._others[1]

    def _serving_now(self, now: int) -> dict[int, set[int | str | None]]:
        """Each card's on-demand holders right now (uid and name): the server on an on-demand booking goes with it
        (`_make_way`), so its processes keep nobody off the card."""
        if not any(c.processes for c in self.cards.values()):
            return {}
        found: dict[int, set[int | str | None]] = {}
        for booking in rows.live_between(self.conn, now, now + 1, on_demand=True):
            for uuid in booking.card_uuids:
                if uuid in self.by_uuid:
                    found.setdefault(self.by_uuid[uuid], set()).update((booking.uid, booking.user))
        return found

    def _held_now(self, now: int) -> set[int]:
        """The cards the caller holds a booking on right now; only asked when some process has no owner."""
        if not any(p.uid is None and p.user is None for c in self.cards.values() for p in c.processes):
            return set()
        return {self.by_uuid[u] for b in rows.live_between(self.conn, now, now + 1, user=self.me.name)
                for u in b.card_uuids if u in self.by_uuid}

    def _foreign(self, card: CardReading, mine: bool) -> list[GpuProcess]:
        """Another user's processes on the card. One nobody can name (a container's) may be the holder's own,
        as on the board (cardstate), so it is someone else's only on a card the caller does not hold."""
        def theirs(p: GpuProcess) -> bool:
            if p.uid is not None:
                return p.uid != self.me.uid
            return p.user != self.me.name if p.user is not None else not mine

        return [p for p in card.processes if theirs(p)]

    @staticmethod
    def _whose(processes: Sequence[GpuProcess], named: bool = False) -> str:
        """Whose processes, and their VRAM where NVML says: "bob's processes, 9.0 GiB", or when
        `named` "bob's processes (9.0 GiB)"."""
        users = dict.fromkeys(p.user or UNKNOWN_USER for p in processes)
        used = [p.used_mib for p in processes if p.used_mib is not None]
        whose = " and ".join(user + "'s" for user in users) + " processes"
        if not used:
            return whose
        size = f"{sum(used) / 1024:.1f} GiB"
        return f"{whose} ({size})" if named else f"{whose}, {size}"

    def _host_down(self, cards: tuple[int, ...] | None, start: int, now: int, force: bool) -> str | None:
        """On a host whose service is silent (HOST DOWN) nobody sees what runs on its cards, and nothing there enforces
        a booking: one that starts now is refused unless its cards are named and forced; any is told (a note)."""
        if self.down_since is None:
            return None
        silent = f"host {self.host} is down (no word from its service since {stamp_time(self.down_since, now)})"
        if start <= now + PAST_GRACE_SECONDS and not (cards is not None and force):
            raise Conflict(f"{silent}: nobody can see what runs on its cards now; book another host's cards, or name"
                           " the cards (--cards) and pass --force to book them anyway")
        return f"{silent}: booked anyway; nobody can see what runs on its cards until it is back"

    def _hot(self, index: int) -> bool:
        temperature = self.cards[index].temperature_c
        return temperature is not None and temperature >= self.config.hot_celsius

    def _busy_by_index(self, after: int, before: int | None, excluding: int | None,
                       yielding: bool = False) -> dict[int, list[tuple[int, int]]]:
        """Each card's taken spans (those of the bookings a plan sees: `_seen`), or with `yielding` the on-demand
        bookings' spans, which a plan may take."""
        by_uuid = rows.busy_by_card(self.conn, after, before, excluding, on_demand=True if yielding else self._seen())
        return {self.by_uuid[u]: spans for u, spans in by_uuid.items() if u in self.by_uuid}

    def _seen(self) -> bool | None:
        """Which bookings take a plan's cards: every one for an on-demand booking's (they block each other), only those
        not on demand for any other's (on-demand bookings yield to it: `_make_way`). As rows.busy_by_card's
        `on_demand`."""
        return None if self._scope.on_demand else False

    def _make_way(self, cards: Sequence[int], start: int, end: int, now: int, excluding: int | None = None) -> list[int]:
        """Before a booking that is not on demand is written on `cards` over [start, end): cut each on-demand booking
        there to end YIELD_GAP_SECONDS before `start` (never before now: the past stays), or cancel it if it has not
        started (or would keep nothing). Returns their ids, for `_yielded` once the booking is written. The gateway
        drains the server on it before that end, and the enforcement stops it, as for any booking's end."""
        if self._scope.on_demand:
            return []
        cut = []
        for booking in rows.overlapping(self.conn, [self.cards[i].uuid for i in cards], start, end, excluding,
                                        on_demand=True):
            until = min(max(now, start - YIELD_GAP_SECONDS), start)  # a start a moment past (the grace) has it at start
            if booking.start > now or until <= booking.start:
                rows.set_cancelled(self.conn, booking.id)
            else:
                rows.cut_end(self.conn, booking.id, until)
            cut.append(booking.id)
        return cut

    def _yielded(self, cut: Sequence[int], by: int, now: int, actor: tuple[int, str] | None = None) -> None:
        """Audit each on-demand booking `_make_way` cut for booking `by`, as the writer's (`actor`: uid and name, default
        the caller). Its holder is the runner's account: nobody to tell."""
        uid, name = actor or (self.me.uid, self.me.name)
        for booking_id in cut:
            events.record(self.conn, ts=now, uid=uid, actor=name, action="on-demand-yield", booking_id=booking_id,
                          ok=True, details={"booking": booking_id, "by": by})

    def _check_free(self, cards: Sequence[int], start: int, end: int, excluding: int | None = None) -> None:
        uuids = [self.cards[i].uuid for i in cards]
        clash = rows.first_conflict(self.conn, uuids, start, end, excluding, on_demand=self._seen())
        if clash is not None:
            raise SlotTaken(clash, cards, self.clock())


class SlotTaken(Conflict):
    """The cards are booked by someone else: who, and until when."""

    def __init__(self, clash: Booking, cards: Sequence[int], now: float):
        taken = sorted(set(clash.cards) & set(cards))
        one = len(taken) == 1
        super().__init__(
            f"{'card' if one else 'cards'} {format_cards(taken)} {'is' if one else 'are'} booked by {clash.user}"
            f" {held(clash, now)} (booking {clash.id})"
        )


def held(booking: Booking, now: float) -> str:
    """When a booking in the way holds its cards: 'until 12:00 (in 4 h)' once it has started, else from when:
    'from 08:00 (in 30 min) to 12:00', for a clash that starts later than now is not 'until' its end."""
    if booking.start <= now:
        return f"until {stamp_when(booking.end, now)}"
    return f"from {stamp_when(booking.start, now)} to {stamp_time(booking.end, now)}"


__all__ = ["BookingService", "Booking", "BoardError", "Plan", "SlotTaken", "format_cards"]

"""Booking rules: create, cancel, release, extend and reassign, each one short IMMEDIATE transaction.

Every change and every refusal by rule (conflict, not permitted) is written to the audit log.
Bad input writes nothing, except from an admin's reassign: an admin acting on someone else's booking
leaves a trace whatever the outcome.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from app.config import CLASSES, Config
from app.core import policy
from app.errors import BadInput, BoardError, Conflict, NotPermitted
from app.core.identity import Identity, lookup_user
from app.core.text import format_cards, format_time
from app.model import Booking
from app.core.cardstate import UNKNOWN_USER
from app.core.slots import GROUP_SIZES, find_slot, is_free, next_free_start
from app.gpu.model import CardReading, GpuProcess, Topology
from app.store import bookings as rows
from app.store import events
from app.store.db import write

MAX_NOTE_CHARS = 500
PAST_GRACE_SECONDS = 60
# Slot searches first read the calendar this far past the wanted slot, and all of it only when that
# finds nothing: a full calendar is a long read to hold the write lock for.
LOOKAHEAD_SECONDS = 86400
MAX_CANDIDATES = 60  # booking ends tried as starts by `options`: enough for 3 slots on a busy calendar


@dataclass(frozen=True, slots=True)
class Plan:
    """A booking that passed every rule, ready to insert."""

    cards: tuple[int, ...]
    uuids: tuple[str, ...]
    start: int
    end: int
    notes: tuple[str, ...] = ()  # one line each: cards passed over or taken despite what runs on them now


def _worded(method):
    """Adds the next free start to a SlotTaken on its way out, once the write lock is released:
    a scan of the calendar has no place inside it."""

    @functools.wraps(method)
    def wrapper(self: BookingService, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except SlotTaken as taken:
            free_at = self.next_free(taken.cards, taken.start, taken.duration, taken.excluding)
            raise Conflict(f"{taken}; next free start for cards {format_cards(taken.cards)}: "
                           f"{format_time(free_at, self.clock())}") from None

    return wrapper


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
    ):
        self.conn, self.me, self.config, self.topology, self.clock = conn, me, config, topology, clock
        self.jobs = jobs  # booking id -> pids of the `board run` jobs registered for it (the service knows)
        self.cards = {c.index: c for c in cards}
        self.by_uuid = {c.uuid: c.index for c in cards}

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
        user: str | None = None,
    ) -> Plan:
        """Check a booking against every rule without writing; raises the error `create` would."""
        now = int(self.clock())
        klass = self._check_class(klass)
        if start < now - PAST_GRACE_SECONDS:
            raise BadInput(f"the start {format_time(start, now)} is in the past; pick a start from now on")
        if end <= start:
            raise BadInput("the end must be after the start")
        duration = end - start
        # What runs on the cards now says nothing about a slot that starts later.
        now_slot = start <= now + PAST_GRACE_SECONDS
        notes: list[str] = []
        if cards is not None:
            chosen = self._check_cards(cards)
            self._check_free(chosen, start, end)
            if now_slot:
                mine = self._held_now(now)
                notes = [f"card {i} has {self._whose(found, named=True)} now"
                         for i in chosen if (found := self._foreign(self.cards[i], i in mine))]
        else:
            chosen, start, notes = self._pick(count, klass, start, duration, now, now_slot)
            end = start + duration
        held = [(b.start, b.end, len(b.cards)) for b in rows.live_between(self.conn, start, end, user=user or self.me.name)]
        policy.check(self.config, cards=chosen, klass=klass, start=start, end=end, now=now, held=held)
        return Plan(chosen, tuple(self.cards[i].uuid for i in chosen), start, end, tuple(notes))

    plan = _worded(_plan)

    def options(self, count: int, klass: str, start: int, duration: int, limit: int = 3) -> list[tuple[Plan, int | None]]:
        """The earliest slots, each on a different group of `count` cards, where every rule lets a `klass`
        booking of `duration` start; with each, when its cards stop being free (None: not within a day
        past the slot). Candidate starts are `start` and each moment a booking on some card ends."""
        self._check_class(klass)
        if count not in GROUP_SIZES:
            raise BadInput(f"a group is 1, 2, 4 or 8 cards, not {count}")
        horizon = start + int(self.config.policy.max_ahead_days * 86400)
        ends = sorted({b.end for b in rows.live_between(self.conn, start, horizon) if b.end > start})[:MAX_CANDIDATES]
        found: list[tuple[Plan, int | None]] = []
        for candidate in [start, *ends]:
            if len(found) == limit:
                break
            try:
                plan = self._plan(count=count, start=candidate, end=candidate + duration, klass=klass)
            except (Conflict, NotPermitted, BadInput):
                continue
            busy = self._busy_by_index(plan.end, plan.end + LOOKAHEAD_SECONDS, None)
            starts = [begin for i in plan.cards for begin, _ in busy.get(i, ()) if begin >= plan.end]
            # A later slot on cards already offered adds nothing unless the earlier one was cut short.
            if not any(plan.cards == seen.cards and (until is None or plan.start < until) for seen, until in found):
                found.append((plan, min(starts) if starts else None))
        return found

    def next_free(self, cards: Sequence[int], start: int, duration: int, excluding: int | None = None) -> int:
        """The earliest start at or after `start` where `cards` are free for `duration`."""
        chosen = self._check_cards(cards)
        return self._search(start, duration, excluding,
                            lambda busy, until: next_free_start(busy, chosen, start, duration, until))

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
    ) -> tuple[Booking, tuple[str, ...]]:
        """Create a booking; also returns the notes on what runs on the cards now (Plan.notes)."""
        note = self._check_note(note)
        details = {"cards": list(cards) if cards is not None else None, "count": count, "start": start,
                   "end": end, "class": klass, "note": note}

        # A count is planned on a plain read first, outside the write lock; inside it the chosen cards
        # are only re-checked like explicit ones, and re-planned if someone took them meanwhile.
        hint = None
        if cards is None:
            try:
                hint = self._plan(count=count, start=start, end=end, klass=klass)
            except BoardError:
                pass  # the planning inside the lock raises it again, and audits it

        notes: tuple[str, ...] = ()

        def change(now: int) -> int:
            nonlocal notes
            plan = None
            if hint is not None:
                try:
                    plan = self._plan(cards=hint.cards, start=hint.start, end=hint.end, klass=klass)
                    notes = hint.notes  # why the count picked these cards
                except Conflict:
                    pass
            if plan is None:
                plan = self._plan(cards=cards, count=count, start=start, end=end, klass=klass)
                notes = plan.notes
            rows.sync_cards(self.conn, self.cards.values(), now)
            booking_id = rows.insert(
                self.conn, user=self.me.name, uid=self.me.uid, uuids=plan.uuids, start=plan.start, end=plan.end,
                klass=klass, note=note, request=request, now=now, created_by=self.me.uid,
            )
            details.update(cards=list(plan.cards), start=plan.start, end=plan.end)
            return booking_id

        return self._audited("create", None, details, change), notes

    def cancel(self, booking_id: int) -> Booking:
        def change(now: int) -> int:
            self._end_now(self._editable(booking_id, "cancel", now), now)
            return booking_id

        return self._audited("cancel", booking_id, {}, change)

    def release(self, booking_id: int) -> Booking:
        def change(now: int) -> int:
            booking = self._editable(booking_id, "release", now)
            if booking.start > now:
                raise BadInput(f"booking {booking_id} has not started yet; cancel it instead")
            self._end_now(booking, now)
            return booking_id

        return self._audited("release", booking_id, {}, change)

    @_worded
    def extend(self, booking_id: int, end: int) -> Booking:
        details = {"end": end}

        def change(now: int) -> int:
            booking = self._editable(booking_id, "extend", now)
            if end <= booking.end:
                raise BadInput(f"the new end must be after the current end {format_time(booking.end, now)}")
            self._check_free(booking.cards, booking.end, end, excluding=booking_id)
            held = [(b.start, b.end, len(b.cards))
                    for b in rows.live_between(self.conn, booking.start, end, user=booking.user) if b.id != booking_id]
            policy.check(self.config, cards=booking.cards, klass=booking.klass, start=booking.start, end=end,
                         now=min(now, booking.start), held=held)
            details["old_end"] = booking.end
            rows.set_times(self.conn, booking_id, booking.start, end)
            return booking_id

        return self._audited("extend", booking_id, details, change)

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

        Cards do not move under running work: live servers or jobs (`_running`) refuse the move unless
        `force`. Forced, the split ends the original at now, so the service's enforcement stops them.
        """
        details: dict[str, Any] = {"cards": list(cards) if cards is not None else None, "user": user}

        def change(now: int) -> int:
            if not self.me.is_admin:
                raise NotPermitted(f"only admins (group {self.config.admin_group}) can reassign bookings")
            booking = self._editable(booking_id, "reassign", now)
            details.update(old_cards=list(booking.cards), old_user=booking.user)
            owner = (booking.user, booking.uid)
            if user is not None:
                found = lookup_user(user)
                if found is None:
                    raise BadInput(f"no user {user!r} on this server")
                owner = found
                details["user"] = owner[0]
            chosen = booking.cards
            if cards is not None:
                chosen = self._check_cards(cards)
                if len(chosen) != len(booking.cards):
                    raise BadInput(f"booking {booking_id} has {len(booking.cards)} card(s); give as many")
                details["cards"] = list(chosen)
            if chosen != booking.cards:
                running = self._running(booking_id)
                if running and not force:
                    them = "it" if len(running) == 1 else "them"
                    raise Conflict(
                        f"booking {booking_id} has {', '.join(running)} running on cards {format_cards(booking.cards)};"
                        f" stop {them} first, or pass --force to stop {them} and move the booking"
                    )
                if running:
                    details["stopped"] = running
                self._check_free(chosen, max(booking.start, now), booking.end, excluding=booking_id)
                rows.sync_cards(self.conn, self.cards.values(), now)
                uuids = [self.cards[i].uuid for i in chosen]
                if booking.start < now:
                    rows.set_times(self.conn, booking_id, booking.start, now)  # first: the pieces meet at now
                    rest = rows.insert(
                        self.conn, user=owner[0], uid=owner[1], uuids=uuids, start=now, end=booking.end,
                        klass=booking.klass, note=booking.note, request=booking.request, now=now,
                        created_by=self.me.uid,
                    )
                    details.update(split_at=now, from_booking=booking_id, to_booking=rest)
                    return rest
                rows.set_cards(self.conn, booking_id, uuids)
            if owner != (booking.user, booking.uid):
                rows.set_owner(self.conn, booking_id, *owner)
            return booking_id

        return self._audited("reassign", booking_id, details, change)

    # -- helpers -------------------------------------------------------------------------------

    def _audited(self, action: str, booking_id: int | None, details: dict, change: Callable[[int], int]) -> Booking:
        """Run `change` and its audit event in one transaction; a refusal by rule is audited in the same one.

        `change` returns the booking to hand back; the event is filed under `booking_id` when given (the
        booking acted on), else under the returned one (a new booking). Refusals by rule (Conflict,
        NotPermitted) are audited; bad input writes nothing.
        """
        now = int(self.clock())
        refusal: BoardError | None = None
        result_id = booking_id
        try:
            with write(self.conn):
                self.conn.execute("SAVEPOINT attempt")
                try:
                    result_id = change(now)
                except (Conflict, NotPermitted) as refused:
                    self.conn.execute("ROLLBACK TO attempt")
                    refusal, details = refused, {**details, "refused": str(refused)}
                events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action=action,
                              booking_id=booking_id if booking_id is not None else result_id,
                              ok=refusal is None, details=details)
        except sqlite3.IntegrityError as error:
            # Only the overlap triggers can get here: another writer beat us past the app's own check.
            raise Conflict(f"the cards were just booked by someone else; try again ({error})") from None
        if refusal is not None:
            raise refusal
        return self.get(result_id)

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
        self, count: int | None, klass: str, start: int, duration: int, now: int, now_slot: bool
    ) -> tuple[tuple[int, ...], int, list[str]]:
        """The best-connected `count` cards at the earliest start, and notes on the cards passed over.

        A slot that starts now leaves out cards with another user's processes, and HOT cards while a
        cooler group can start at the same time."""
        if count not in GROUP_SIZES:
            raise BadInput(f"a group is 1, 2, 4 or 8 cards, not {count}")
        eligible = [
            i for i, c in sorted(self.cards.items())
            if not c.lost and policy.card_refusal(self.config, i, klass, start, start + duration) is None
        ]
        mine = self._held_now(now) if now_slot else set()
        foreign = {i: found for i in eligible if now_slot and (found := self._foreign(self.cards[i], i in mine))}
        clean = [i for i in eligible if i not in foreign]
        cool = [i for i in clean if not (now_slot and self._hot(i))]

        def pick(busy, until):
            found = find_slot(busy, clean, count, start, duration, self.topology, until)
            if found is None or len(cool) == len(clean):
                return found
            # A HOT card only when no cooler group can start at the same time.
            cooler = find_slot(busy, cool, count, found[1], duration, self.topology, until)
            return cooler if cooler is not None and cooler[1] == found[1] else found

        found = self._search(start, duration, None, pick)
        # Passed over: the cards left out that the calendar had free, at the start asked for or the one found.
        why = {i: self._whose(procs) for i, procs in foreign.items()}
        if found is not None:
            why.update({i: f"{self.cards[i].temperature_c} °C" for i in clean if i not in cool and i not in found[0]})
        passed = []
        if why:
            slots = [(begin, begin + duration) for begin in {start, found[1] if found is not None else start}]
            busy = self._busy_by_index(start, max(slots)[1], None)
            passed = [f"card {i} ({why[i]})" for i in sorted(why) if any(is_free(busy, (i,), s) for s in slots)]
        if found is None:
            also = f"; passed over {', '.join(passed)}" if passed else ""
            raise Conflict(f"no {count} cards can take a {klass} booking{also}; see 'board status'")
        chosen, begin = found
        notes = [f"passed over {', '.join(passed)}"] if passed else []
        notes += [f"took card {i} though it is HOT ({self.cards[i].temperature_c} °C): no cooler group"
                  " could start then" for i in chosen if i not in cool]
        return chosen, begin, notes

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

    def _hot(self, index: int) -> bool:
        temperature = self.cards[index].temperature_c
        return temperature is not None and temperature >= self.config.hot_celsius

    def _search(self, start: int, duration: int, excluding: int | None, search: Callable[[dict, int | None], Any]):
        """`search(busy, until)` on the calendar's next day past the slot, then on all of it if that finds nothing."""
        until = start + duration + LOOKAHEAD_SECONDS
        found = search(self._busy_by_index(start, until, excluding), until)
        return found if found is not None else search(self._busy_by_index(start, None, excluding), None)

    def _busy_by_index(self, after: int, before: int | None, excluding: int | None) -> dict[int, list[tuple[int, int]]]:
        by_uuid = rows.busy_by_card(self.conn, after, before, excluding)
        return {self.by_uuid[u]: spans for u, spans in by_uuid.items() if u in self.by_uuid}

    def _check_free(self, cards: Sequence[int], start: int, end: int, excluding: int | None = None) -> None:
        uuids = [self.cards[i].uuid for i in cards]
        clash = rows.first_conflict(self.conn, uuids, start, end, excluding)
        if clash is not None:
            raise SlotTaken(clash, cards, start, end - start, excluding, self.clock())


class SlotTaken(Conflict):
    """The cards are booked by someone else; the caller adds the next free start once the lock is released."""

    def __init__(self, clash: Booking, cards: Sequence[int], start: int, duration: int, excluding: int | None, now: float):
        taken = sorted(set(clash.cards) & set(cards))
        one = len(taken) == 1
        super().__init__(
            f"{'card' if one else 'cards'} {format_cards(taken)} {'is' if one else 'are'} booked by {clash.user}"
            f" until {format_time(clash.end, now)} (booking {clash.id})"
        )
        self.cards, self.start, self.duration, self.excluding = tuple(cards), start, duration, excluding



__all__ = ["BookingService", "Booking", "BoardError", "Plan", "format_time", "format_cards"]

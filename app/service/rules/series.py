"""Standing slots: one rule (app.core.series) booked as many bookings on the same cards, linked by a series id.

Every occurrence passes the same rules as a booking made by hand (BookingService._plan: the cards,
conflicts, and the policy, each occurrence on its own). A series is made or extended in one write
transaction, all or nothing: occurrences that conflict are listed with their holder and nothing is
booked, unless `skip_conflicts`, which books the others and lists those it skipped. Policy refusals
always refuse the whole request (exit 4), unless an admin passes `override_policy`; then each
overridden occurrence's audit event says which rule it broke.

Clock times are read in the policy zone (app.core.policy.policy_zone), the zone pool windows are
read in, so a slot keeps its wall-clock times across DST changes whatever the caller's TZ. The
occurrences a refusal names are instants, worded in the reader's zone (app.core.text.stamp_day).
Cancelling a series cancels the occurrences that have not started; past ones stay as history, and
a running one is left to its holder (`board release ID`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Sequence

from app.core import policy
from app.core.series import MAX_SPAN_DAYS, Rule, describe, local_date, make_rule, occurrences, parse_date
from app.core.text import stamp_day
from app.errors import BadInput, Conflict, NotPermitted
from app.model import Booking
from app.service.rules.bookings import BookingService
from app.store import bookings as rows
from app.store import events
from app.store import series as store
from app.store.series import Series

MAX_LISTED = 10  # occurrences named in one refusal; the rest are counted


@dataclass(frozen=True, slots=True)
class Miss:
    """An occurrence that was not booked as asked, and why (a conflict, or the policy rule it breaks)."""

    start: int
    end: int
    reason: str

    def to_wire(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "reason": self.reason}


@dataclass(frozen=True)
class Outcome:
    """What a booking or an extension of a series did."""

    series: Series
    booked: list[Booking]
    skipped: list[Miss] = field(default_factory=list)  # conflicts passed over (skip_conflicts)
    overridden: list[Miss] = field(default_factory=list)  # booked despite the policy (override_policy)


class SeriesService:
    """Series rules for one caller, on top of the booking rules bound to the same connection."""

    def __init__(self, rules: BookingService):
        self.rules = rules
        self.conn, self.me, self.config, self.clock = rules.conn, rules.me, rules.config, rules.clock
        self.tz = policy.policy_zone(self.config)

    # -- queries -------------------------------------------------------------------------------

    def get(self, series_id: int) -> tuple[Series, list[Booking]]:
        """The series and all its bookings (cancelled ones too), earliest first."""
        return self._series(series_id), store.occurrences(self.conn, series_id)

    # -- changes -------------------------------------------------------------------------------

    def book(
        self,
        *,
        cards: Sequence[int],
        every: str,
        start: str,
        until: str,
        last: str,
        first: str | None = None,
        klass: str = "experiment",
        note: str = "",
        skip_conflicts: bool = False,
        override_policy: bool = False,
        project: str | None = None,
    ) -> Outcome:
        """Book every occurrence of the rule from `first` (default today) to `last` (dates, inclusive), for `project`
        (default the caller's only one)."""
        now = int(self.clock())
        today = local_date(now, self.tz)
        first_day = parse_date(first, "--from") if first is not None else today
        if first_day < today:
            raise BadInput(f"--from {first_day.isoformat()} is in the past; a series starts today"
                           f" ({today.isoformat()}) at the earliest")
        rule = make_rule(every, start, until, first_day, parse_date(last, "--to"))
        klass = self.rules._check_class(klass)
        note = self.rules._check_note(note)
        spans = self._ahead(rule, now)
        stored = {**rule.to_json(), "cards": sorted(set(cards)), "class": klass, "note": note,
                  "zone": self.config.policy.timezone, **({"project": project} if project else {})}
        details: dict[str, Any] = {"rule": stored, "skip_conflicts": skip_conflicts, "override_policy": override_policy}

        def change(now: int) -> int:
            chosen = self.rules._check_cards(cards)
            owner = (self.me.name, self.me.uid)
            if not override_policy:  # one line rather than one per occurrence (_check would refuse each)
                self.rules._check_access(klass, owner[0])
            chosen_project = self.rules._check_project(project, klass, owner[0])
            if chosen_project:
                stored["project"] = chosen_project
            free, skipped, overridden = self._check(chosen, klass, spans, skip_conflicts, override_policy, owner[0],
                                                    chosen_project)
            series_id = store.insert(self.conn, user=owner[0], uid=owner[1], rule=stored, now=now)
            booked = self._insert(series_id, owner, chosen, klass, note, free, overridden, now, chosen_project,
                                  override_policy, details)
            details.update(series_id=series_id, bookings=booked, skipped=[m.to_wire() for m in skipped],
                           overridden=[m.to_wire() for m in overridden])
            return series_id

        series_id = self.rules.audited("series", details, change)
        return self._outcome(series_id, details)

    def extend(self, series_id: int, last: str, *, skip_conflicts: bool = False, override_policy: bool = False) -> Outcome:
        """Move the series' last day to `last`, booking the new occurrences under the same all-or-nothing rule."""
        new_last = parse_date(last, "--to")
        details: dict[str, Any] = {"series_id": series_id, "to": new_last.isoformat(),
                                   "skip_conflicts": skip_conflicts, "override_policy": override_policy}

        def change(now: int) -> int:
            series = self._editable(series_id, "extend")
            rule = self._rule(series)
            if series.rule.get("cancelled_at") is not None:
                raise BadInput(f"series {series_id} was cancelled; book a new one")
            if new_last <= rule.last:
                raise BadInput(f"--to {new_last.isoformat()} is not after the series' last day"
                               f" {rule.last.isoformat()}; give a later date")
            first = max(rule.last + timedelta(days=1), local_date(now, self.tz))
            if (new_last - first).days > MAX_SPAN_DAYS:
                raise BadInput(f"{first.isoformat()} to {new_last.isoformat()} is {(new_last - first).days} days;"
                               f" extend a series by at most {MAX_SPAN_DAYS} days at a time")
            spans = self._ahead(rule.with_dates(first, new_last), now)
            klass, note = series.rule.get("class", "experiment"), series.rule.get("note", "")
            chosen = self.rules._check_cards(series.rule.get("cards") or [])
            owner = (series.user, series.uid)  # an admin's extension is still the holder's
            if not override_policy:
                self.rules._check_access(klass, owner[0])
            project = series.rule.get("project") or ""
            free, skipped, overridden = self._check(chosen, klass, spans, skip_conflicts, override_policy, owner[0],
                                                    project)
            booked = self._insert(series_id, owner, chosen, klass, note, free, overridden, now, project, override_policy,
                                  details)
            store.set_rule(self.conn, series_id, {**series.rule, "to": new_last.isoformat()})
            details.update(old_to=rule.last.isoformat(), bookings=booked, skipped=[m.to_wire() for m in skipped],
                           overridden=[m.to_wire() for m in overridden])
            return series_id

        self.rules.audited("series_extend", details, change)
        return self._outcome(series_id, details)

    def cancel(self, series_id: int) -> tuple[Series, list[Booking], list[Booking]]:
        """Cancel the occurrences that have not started; returns the series, those cancelled, and the one running."""
        details: dict[str, Any] = {"series_id": series_id}

        def change(now: int) -> int:
            series = self._editable(series_id, "cancel")
            if series.rule.get("cancelled_at") is not None:
                raise BadInput(f"series {series_id} is already cancelled")
            found = [b for b in store.occurrences(self.conn, series_id) if b.status == "booked"]
            ahead = [b for b in found if b.start > now]
            running = [b.id for b in found if b.start <= now < b.end]
            if not ahead:
                also = f"; booking {running[0]} is running: 'board release {running[0]}' ends it" if running else ""
                raise BadInput(f"series {series_id} has no occurrences ahead to cancel{also}")
            for booking in ahead:
                rows.set_cancelled(self.conn, booking.id)
                events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action="cancel",
                              booking_id=booking.id, ok=True, details={"series_id": series_id})
            store.set_rule(self.conn, series_id, {**series.rule, "cancelled_at": now})
            details.update(cancelled=[b.id for b in ahead], running=running)
            return series_id

        self.rules.audited("series_cancel", details, change)
        get = self.rules.get
        return self._series(series_id), [get(i) for i in details["cancelled"]], [get(i) for i in details["running"]]

    # -- helpers -------------------------------------------------------------------------------

    def _check(
        self, cards: tuple[int, ...], klass: str, spans: list[tuple[int, int]], skip: bool, override: bool, user: str,
        project: str,
    ) -> tuple[list[tuple[int, int]], list[Miss], list[Miss]]:
        """(the occurrences to book, the conflicts skipped, the policy refusals overridden); raises when the
        policy refuses any (NotPermitted, unless overridden) or any conflicts (Conflict, unless skipped).
        `user` is the holder, whose other bookings count against the per-user card limit."""
        if override and not self.me.is_admin:
            raise NotPermitted(f"only admins (group {self.config.admin_group}) can pass --override-policy")
        free: list[tuple[int, int]] = []
        conflicts: list[Miss] = []
        refusals: list[Miss] = []
        overridden: list[Miss] = []
        for start, end in spans:
            try:
                self.rules._plan(cards=cards, start=start, end=end, klass=klass, user=user, project=project or None)
            except Conflict as taken:
                conflicts.append(Miss(start, end, str(taken)))
                continue
            except NotPermitted as refused:
                if not override:
                    refusals.append(Miss(start, end, str(refused)))
                    continue
                try:  # the policy is overridden, never a conflict (whatever order _plan checks them in)
                    self.rules._check_free(cards, start, end)
                except Conflict as taken:
                    conflicts.append(Miss(start, end, str(taken)))
                    continue
                overridden.append(Miss(start, end, str(refused)))
            free.append((start, end))
        if refusals:
            raise NotPermitted(self._refused(refusals, conflicts, free, len(spans)))
        if conflicts and not skip:
            others = f"; pass --skip-conflicts to book the other {len(free)}" if free else ""
            verb = "conflicts" if len(conflicts) == 1 else "conflict"
            raise Conflict(f"{self._count(conflicts, len(spans))} {verb}, so nothing was booked: "
                           f"{self._listed(conflicts)}{others}")
        if not free:
            raise Conflict(f"all {len(spans)} occurrences conflict, so nothing was booked: {self._listed(conflicts)}")
        return free, conflicts, overridden

    def _insert(self, series_id: int, owner: tuple[str, int], cards: tuple[int, ...], klass: str, note: str,
                free: list[tuple[int, int]], overridden: list[Miss], now: int, project: str, override: bool,
                details: dict[str, Any]) -> list[int]:
        """One booking per free occurrence, each with its own create event (naming the rule it overrode, if any).
        All of them together are held to their project's budget (one line for the series, never one occurrence's);
        an admin's --override-policy past it is in the series' event (`details`)."""
        rows.sync_cards(self.conn, self.rules.cards.values(), now, self.rules.host)
        uuids = [self.rules.cards[i].uuid for i in cards]
        broken = {m.start: m.reason for m in overridden}
        if over := self.rules._check_budget(project, free, len(cards), None, over=override, what="series"):
            details["over_budget"] = over
        booked = []
        for start, end in free:
            cut = self.rules._make_way(cards, start, end, now)  # an on-demand booking yields to an occurrence
            booking_id = rows.insert(self.conn, user=owner[0], uid=owner[1], uuids=uuids, start=start, end=end,
                                     klass=klass, note=note, request=None, now=now, created_by=self.me.uid,
                                     series_id=series_id, project=project)
            self.rules._yielded(cut, booking_id, now)
            event = {"cards": list(cards), "start": start, "end": end, "class": klass, "note": note,
                     "series_id": series_id}
            if start in broken:
                event["override_policy"] = broken[start]
            events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action="create",
                          booking_id=booking_id, ok=True, details=event)
            booked.append(booking_id)
        return booked

    def _ahead(self, rule: Rule, now: int) -> list[tuple[int, int]]:
        """The rule's occurrences that start from now on; BadInput when there are none."""
        spans = [(start, end) for start, end in occurrences(rule, self.tz) if start >= now]
        if not spans:
            raise BadInput(f"no occurrences: {describe(rule.to_json())} has no day ahead to book;"
                           " check --every and the dates")
        return spans

    def _series(self, series_id: int) -> Series:
        found = store.get(self.conn, series_id)
        if found is None:
            raise BadInput(f"no series {series_id}; 'board list' shows each booking's series")
        return found

    def _editable(self, series_id: int, verb: str) -> Series:
        series = self._series(series_id)
        if series.uid != self.me.uid and not self.me.is_admin:
            raise NotPermitted(f"series {series_id} belongs to {series.user}; only they or an admin can {verb} it")
        return series

    def _rule(self, series: Series) -> Rule:
        try:
            return Rule.from_json(series.rule)
        except (KeyError, TypeError, ValueError) as error:
            raise BadInput(f"series {series.id} has a malformed rule ({str(error)[:60]}); cancel it and book anew") from None

    def _outcome(self, series_id: int, details: dict[str, Any]) -> Outcome:
        def misses(key: str) -> list[Miss]:
            return [Miss(m["start"], m["end"], m["reason"]) for m in details[key]]

        return Outcome(self._series(series_id), [self.rules.get(i) for i in details["bookings"]],
                       misses("skipped"), misses("overridden"))

    def _listed(self, misses: list[Miss]) -> str:
        shown = "; ".join(f"{stamp_day(m.start)}: {m.reason}" for m in misses[:MAX_LISTED])
        return shown + (f"; and {len(misses) - MAX_LISTED} more" if len(misses) > MAX_LISTED else "")

    @staticmethod
    def _count(misses: list[Miss], total: int) -> str:
        return f"{len(misses)} of {total} occurrences" if total > 1 else "the occurrence"

    def _refused(self, refusals: list[Miss], conflicts: list[Miss], free: list[tuple[int, int]], total: int) -> str:
        """One line: the policy's refusals grouped by rule, the conflicts, and what to do."""
        by_rule: dict[str, list[int]] = {}
        for miss in refusals:
            by_rule.setdefault(miss.reason, []).append(miss.start)
        groups = []
        for reason, starts in by_rule.items():
            days = stamp_day(starts[0]) if len(starts) == 1 else (
                f"{len(starts)} occurrences, {stamp_day(starts[0])} to {stamp_day(starts[-1])}")
            groups.append(f"{reason} ({days})")
        message = f"the policy refuses {self._count(refusals, total)}, so nothing was booked: {'; '.join(groups)}"
        if conflicts:
            message += f"; also {len(conflicts)} {'conflict' if len(conflicts) == 1 else 'conflicts'}: {self._listed(conflicts)}"
        if free and min(m.start for m in refusals) > max(start for start, _ in free):
            last_free = local_date(max(start for start, _ in free), self.tz)
            message += (f"; book up to --to {last_free.isoformat()} now and add the rest later with"
                        " 'board series extend'")
        return message + "; admins may pass --override-policy"


__all__ = ["SeriesService", "Outcome", "Miss", "Series"]

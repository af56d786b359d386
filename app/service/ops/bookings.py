"""The operations that book and change bookings: plan, find a slot, book, cancel, release, extend, reassign, move;
and which booking a `board run` job runs under. The rules are app.service.rules.bookings (BookingService)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.identity import Identity
from app.errors import BadInput, Conflict, NotPermitted
from app.model import booking_to_wire
from app.service.ops.registry import BOOL, DICT, INT, LIST, SPAN, STR, TIME, card_list, op

if TYPE_CHECKING:
    from app.service import Service


_SLOT = {"start": TIME, "end": TIME}
_WHICH = {"cards": LIST, "count": INT, "class": STR, "host": STR}  # host: where the cards are (default this host's)


@op("plan", _SLOT, {**_WHICH, "or_later": BOOL})
def plan(service: Service, me: Identity, start: int, end: int, cards=None, count=None, or_later=False, **rest) -> dict:
    found = service.bookings(me, rest.get("host")).plan(cards=card_list(cards), count=count, start=start, end=end,
                                      klass=rest.get("class", "experiment"), or_later=or_later)
    return {"cards": list(found.cards), "uuids": list(found.uuids), "start": found.start, "end": found.end,
            "notes": list(found.notes)}


@op("next_free", _SLOT, _WHICH)
def next_free(service: Service, me: Identity, start: int, end: int, cards=None, count=None, **rest) -> dict:
    rules, klass = service.bookings(me, rest.get("host")), rest.get("class", "experiment")
    if cards is not None:
        chosen = sorted(set(card_list(cards)))
        found = rules.next_free(chosen, start, end - start, klass=klass)
        if found is None:
            raise Conflict(f"no start within {service.config.policy.max_ahead_days:g} days works for cards"
                           f" {','.join(map(str, chosen))}; try other cards or a shorter slot")
        return {"cards": chosen, "start": found}
    found = rules.plan(count=count, start=start, end=end, klass=klass, or_later=True)
    return {"cards": list(found.cards), "start": found.start}


@op("earliest", {"start": TIME, "duration": SPAN}, {**_WHICH, "excluding": INT, "user": STR})
def earliest(service: Service, me: Identity, start: int, duration: int, cards=None, count=None, excluding=None,
             user=None, **rest) -> dict:
    """A refusal's second half, worded only when a client shows it: the earliest start that works for the search the
    refusal carried (its error's `earliest`), or that none does."""
    if user not in (None, me.name) and not me.is_admin:
        raise NotPermitted("earliest: only admins search under another user's limits")
    if duration <= 0:
        raise BadInput("earliest: the duration must be positive")
    search = {"cards": card_list(cards), "count": count, "class": rest.get("class", "experiment"), "start": start,
              "duration": duration, "excluding": excluding, "user": user}
    return {"words": service.bookings(me, rest.get("host")).earliest_words(search)}


@op("slots", _SLOT, {"count": INT, "class": STR, "limit": INT})
def slots(service: Service, me: Identity, start: int, end: int, count=1, limit=3, **rest) -> dict:
    """Up to `limit` earliest slots on different groups of `count` cards (board fit --for)."""
    if not 1 <= limit <= 10:
        raise BadInput("slots: limit is 1 to 10")
    found = service.bookings(me).options(count, rest.get("class", "experiment"), start, end - start, limit)
    return {"slots": [{"cards": list(p.cards), "start": p.start, "end": p.end, "free_until": until}
                      for p, until in found]}


@op("book", _SLOT, {**_WHICH, "note": STR, "request": DICT, "checked": BOOL, "or_later": BOOL, "force": BOOL},
    writes=True)
def book(service: Service, me: Identity, start: int, end: int, cards=None, count=None, note="", request=None,
         checked=False, or_later=False, force=False, **rest) -> dict:
    rules = service.bookings(me, rest.get("host"))
    klass = rest.get("class", "experiment")
    if cards is None and count is None:
        raise BadInput("say which cards: a count (board book 2) or --cards 0,1")
    if cards is not None and count is not None:
        raise BadInput("give a count or --cards, not both")
    if request is not None:  # every member's `board list` shows it: known keys, each in its type and range
        from app.core.request import check  # start-up: only a booking with a request loads its checks

        request = check(request)
    if checked:  # the form's path: a request that fails the check writes nothing at all, not even an audit row
        rules.plan(cards=card_list(cards), count=count, start=start, end=end, klass=klass, or_later=or_later,
                   force=force)
    booking, notes = rules.book(cards=card_list(cards), count=count, start=start, end=end, klass=klass, note=note,
                                request=request, or_later=or_later, force=force)
    # "notes", only when there are any: one line each on what runs on the cards now (passed over, or named)
    return {**booking_to_wire(booking), "notes": list(notes)} if notes else booking_to_wire(booking)


@op("cancel", {"id": INT}, frees=True)
def cancel(service: Service, me: Identity, id: int) -> dict:
    return booking_to_wire(service.bookings(me, booking=id).cancel(id))


@op("release", {"id": INT}, frees=True)
def release(service: Service, me: Identity, id: int) -> dict:
    return booking_to_wire(service.bookings(me, booking=id).release(id))


@op("extend", {"id": INT}, {"end": TIME, "add_seconds": SPAN}, writes=True)
def extend(service: Service, me: Identity, id: int, end=None, add_seconds=None) -> dict:
    rules = service.bookings(me, booking=id)
    if (end is None) == (add_seconds is None):
        raise BadInput("give the new end or how much to add, not both")
    if end is None:
        end = rules.get(id).end + add_seconds
    return booking_to_wire(rules.extend(id, end))


@op("reassign", {"id": INT}, {"cards": LIST, "user": STR, "force": BOOL, "host": STR}, frees=True)
def reassign(service: Service, me: Identity, id: int, cards=None, user=None, force=False, host=None) -> dict:
    if (cards is None) == (user is None):
        raise BadInput("give the new cards or the new user")
    rules = service.bookings(me, booking=id)
    if cards is not None and (host or service.host) != (rules.host or service.host):
        raise BadInput(f"booking {id} is on {rules.host}'s cards; a booking's cards are on one host")
    moved = rules.reassign(id, cards=card_list(cards), user=user, force=force)
    service.wake_enforcer.set()  # work left on the old cards, or of the old holder, stops now rather than later
    return booking_to_wire(moved)


@op("move", {"id": INT, "start": TIME, "end": TIME}, {"override_policy": BOOL}, frees=True)
def move(service: Service, me: Identity, id: int, start: int, end: int, override_policy=False) -> dict:
    """An admin gives a booking new times on the same cards; its holder is told."""
    moved = service.bookings(me, booking=id).move(id, start, end, override_policy=override_policy)
    service.wake_enforcer.set()  # work past the new end stops now rather than at the next pass
    return booking_to_wire(moved)


# -- board run ----------------------------------------------------------------------------------


@op("run", {}, {"booking": INT, "waiting": BOOL})
def run(service: Service, me: Identity, booking=None, waiting=False) -> dict:
    """The booking a `board run` job may run under now: the caller's own, active one. Refusals are audited.
    `waiting` (`board run --wait`, before it waits): the caller's own booking, whether or not it has started."""
    from app.service.box.enforce import run_booking  # start-up: only `board run` loads the enforcer

    if waiting and booking is None:
        raise BadInput("run: waiting needs the booking to wait for")
    return booking_to_wire(run_booking(service, me, booking, waiting))

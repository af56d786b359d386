"""The operations that book and change bookings: plan, find a slot, book, cancel, release, extend, reassign, move;
and which booking a `board run` job runs under. The rules are app.service.rules.bookings (BookingService)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict

from app.core.identity import Identity
from app.errors import BadInput, Conflict, NotPermitted
from app.model import BookingWire, booking_to_wire
from app.service.ops.registry import ById, Int, Request, Span, Time, op

if TYPE_CHECKING:
    from app.service import Service


class Which(Request, frozen=True):
    """Which cards: named, or a count of any; of which class; on which host (default this host's); for which project
    (default the caller's only one)."""
    cards: list[int] | None = None
    count: Int | None = None
    klass: str = "experiment"
    host: str | None = None
    project: str | None = None


class Plan(Which, frozen=True, kw_only=True):
    start: Time
    end: Time
    or_later: bool = False


class Planned(TypedDict):
    cards: list[int]
    uuids: list[str]
    start: int
    end: int
    notes: list[str]


@op("plan", Plan)
def plan(service: Service, me: Identity, request: Plan) -> Planned:
    found = service.bookings(me, request.host).plan(cards=request.cards, count=request.count, start=request.start,
                                                    end=request.end, klass=request.klass, or_later=request.or_later,
                                                    project=request.project)
    return {"cards": list(found.cards), "uuids": list(found.uuids), "start": found.start, "end": found.end,
            "notes": list(found.notes)}


class NextFree(Which, frozen=True, kw_only=True):
    start: Time
    end: Time


class FreeFrom(TypedDict):
    cards: list[int]
    start: int


@op("next_free", NextFree)
def next_free(service: Service, me: Identity, request: NextFree) -> FreeFrom:
    rules, start, end = service.bookings(me, request.host), request.start, request.end
    if request.cards is not None:
        chosen = sorted(set(request.cards))
        found = rules.next_free(chosen, start, end - start, klass=request.klass, project=request.project)
        if found is None:
            raise Conflict(f"no start within {service.config.policy.max_ahead_days:g} days works for cards"
                           f" {','.join(map(str, chosen))}; try other cards or a shorter slot")
        return {"cards": chosen, "start": found}
    planned = rules.plan(count=request.count, start=start, end=end, klass=request.klass, or_later=True,
                         project=request.project)
    return {"cards": list(planned.cards), "start": planned.start}


class Earliest(Which, frozen=True, kw_only=True):
    """A refusal's search (its error's `earliest`): as the refused booking asked, under `user`'s limits."""
    start: Time
    duration: Span
    excluding: Int | None = None
    user: str | None = None


class Words(TypedDict):
    words: str


@op("earliest", Earliest)
def earliest(service: Service, me: Identity, request: Earliest) -> Words:
    """A refusal's second half, worded only when a client shows it: the earliest start that works for the search the
    refusal carried (its error's `earliest`), or that none does."""
    if request.user not in (None, me.name) and not me.is_admin:
        raise NotPermitted("earliest: only admins search under another user's limits")
    if request.duration <= 0:
        raise BadInput("earliest: the duration must be positive")
    search = {"cards": request.cards, "count": request.count, "class": request.klass, "start": request.start,
              "duration": request.duration, "excluding": request.excluding, "user": request.user,
              "project": request.project}
    return {"words": service.bookings(me, request.host).earliest_words(search)}


class Slots(Request, frozen=True):
    start: Time
    end: Time
    count: Int = 1
    klass: str = "experiment"
    limit: Int = 3
    project: str | None = None


class Slot(TypedDict):
    cards: list[int]
    start: int
    end: int
    free_until: int | None  # when its cards stop being free; None: not within a day past the slot


class SlotsFound(TypedDict):
    slots: list[Slot]


@op("slots", Slots)
def slots(service: Service, me: Identity, request: Slots) -> SlotsFound:
    """Up to `limit` earliest slots on different groups of `count` cards (board fit --for)."""
    if not 1 <= request.limit <= 10:
        raise BadInput("slots: limit is 1 to 10")
    found = service.bookings(me).options(request.count, request.klass, request.start, request.end - request.start,
                                         request.limit, request.project)
    return {"slots": [{"cards": list(p.cards), "start": p.start, "end": p.end, "free_until": until}
                      for p, until in found]}


class Book(Which, frozen=True, kw_only=True):
    start: Time
    end: Time
    note: str = ""
    request: dict[str, Any] | None = None  # a model's request (app.core.request): every member's `board list` shows it
    checked: bool = False
    or_later: bool = False
    force: bool = False


class Booked(BookingWire, total=False):
    notes: list[str]  # only when there are any: one line each on what runs on the cards now (passed over, or named)


@op("book", Book)
def book(service: Service, me: Identity, request: Book) -> Booked:
    rules = service.bookings(me, request.host)
    cards, count = request.cards, request.count
    if cards is None and count is None:
        raise BadInput("say which cards: a count (board book 2) or --cards 0,1")
    if cards is not None and count is not None:
        raise BadInput("give a count or --cards, not both")
    wanted = request.request
    if wanted is not None:  # every member's `board list` shows it: known keys, each in its type and range
        from app.core.request import check  # start-up: only a booking with a request loads its checks

        wanted = check(wanted)
    if request.checked:  # the form's path: a request that fails the check writes nothing at all, not even an audit row
        rules.plan(cards=cards, count=count, start=request.start, end=request.end, klass=request.klass,
                   or_later=request.or_later, force=request.force, project=request.project)
    booking, notes = rules.book(cards=cards, count=count, start=request.start, end=request.end, klass=request.klass,
                                note=request.note, request=wanted, or_later=request.or_later, force=request.force,
                                project=request.project)
    reply: Booked = {**booking_to_wire(booking)}
    if notes:
        reply["notes"] = list(notes)
    return reply


@op("cancel", ById)
def cancel(service: Service, me: Identity, request: ById) -> BookingWire:
    return booking_to_wire(service.bookings(me, booking=request.id).cancel(request.id))


@op("release", ById)
def release(service: Service, me: Identity, request: ById) -> BookingWire:
    return booking_to_wire(service.bookings(me, booking=request.id).release(request.id))


class Extend(Request, frozen=True):
    """The new end, or how much to add to the end: one of the two."""
    id: Int
    end: Time | None = None
    add_seconds: Span | None = None


@op("extend", Extend)
def extend(service: Service, me: Identity, request: Extend) -> BookingWire:
    rules = service.bookings(me, booking=request.id)
    if (request.end is None) == (request.add_seconds is None):
        raise BadInput("give the new end or how much to add, not both")
    end = request.end if request.end is not None else rules.get(request.id).end + (request.add_seconds or 0)
    return booking_to_wire(rules.extend(request.id, end))


class Reassign(Request, frozen=True):
    """The new cards (on `host`, default this host) or the new holder: one of the two."""
    id: Int
    cards: list[int] | None = None
    user: str | None = None
    force: bool = False
    host: str | None = None


@op("reassign", Reassign)
def reassign(service: Service, me: Identity, request: Reassign) -> BookingWire:
    id = request.id
    if (request.cards is None) == (request.user is None):
        raise BadInput("give the new cards or the new user")
    rules = service.bookings(me, booking=id)
    if request.cards is not None and (request.host or service.host) != (rules.host or service.host):
        raise BadInput(f"booking {id} is on {rules.host}'s cards; a booking's cards are on one host")
    moved = rules.reassign(id, cards=request.cards, user=request.user, force=request.force)
    service.wake_enforcer.set()  # work left on the old cards, or of the old holder, stops now rather than later
    return booking_to_wire(moved)


class Move(Request, frozen=True):
    id: Int
    start: Time
    end: Time
    override_policy: bool = False


@op("move", Move)
def move(service: Service, me: Identity, request: Move) -> BookingWire:
    """An admin gives a booking new times on the same cards; its holder is told."""
    moved = service.bookings(me, booking=request.id).move(request.id, request.start, request.end,
                                                          override_policy=request.override_policy)
    service.wake_enforcer.set()  # work past the new end stops now rather than at the next pass
    return booking_to_wire(moved)


# -- board run ----------------------------------------------------------------------------------


class Run(Request, frozen=True):
    booking: Int | None = None
    waiting: bool = False


@op("run", Run)
def run(service: Service, me: Identity, request: Run) -> BookingWire:
    """The booking a `board run` job may run under now: the caller's own, active one. Refusals are audited.
    `waiting` (`board run --wait`, before it waits): the caller's own booking, whether or not it has started."""
    from app.service.box.enforce import run_booking  # start-up: only `board run` loads the enforcer

    if request.waiting and request.booking is None:
        raise BadInput("run: waiting needs the booking to wait for")
    return booking_to_wire(run_booking(service, me, request.booking, request.waiting))

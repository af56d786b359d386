"""Models on demand: the team catalog ([[models]]) started on free cards when the gateway asks, and given back idle.

    a keyed request for a cold catalog alias ──model_demand──▶ wake: a booking for the runner account, start now,
        on a group of `cards_needed` cards of the entry's pool (BookingService.book on_demand/within), for
        ttl_s + drain_s; a plan row on it with the entry's spec ──▶ the enforcer starts it through the runner
        (app.service.rules.plans.start_due), as every planned server
    each flush of the gateway ──models_touch──▶ touch: the lease grows to now + ttl_s + drain_s (BookingService.lease:
        never past the next booking on its cards)
    no touch for ttl_s ──▶ the gateway stops routing drain_s before the end ──▶ the enforcement stops the server at
        the end, as for every booking: the cards are the calendar's again. No other timer.
    an entry with a preload window ──keep_pass (each enforcement pass)──▶ woken inside the window, touched while
        inside

Such a booking yields to every other (app.service.rules.bookings): a member's booking over its cards cuts it short,
and the next request books elsewhere if cards are free.
"""

from __future__ import annotations

import logging
import threading
import weakref
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Iterable, TypedDict

from app.config import CatalogModel, PreloadWindow, parse_days, parse_hours
from app.core import projects
from app.core.identity import Identity
from app.core.policy import policy_zone
from app.core.text import format_cards, localize, stamp_when
from app.errors import BadInput, BoardError, Conflict, NotPermitted
from app.model import Booking
from app.service.rules.audit import AGENT, audit
from app.service.rules.plans import SPEC_KEYS, runner_uid
from app.store import bookings as booking_rows
from app.store import events
from app.store import keys as key_rows
from app.store import plans as plan_rows
from app.store.db import write

if TYPE_CHECKING:
    from app.service import Service
    from app.service.conn.agent import Agent

log = logging.getLogger(__name__)

RETRY_UNKNOWN_S = 60  # retry_after when no start is in sight
RETRY_MAX_S = 3600

# One decision at a time per process: two demands for one alias make one booking. Behind the agent every operation
# runs on its one database thread anyway; this keeps in-process callers (threads) to the same answer.
_WAKING = threading.Lock()

# The last touch of each alias, by service: the gateway's word that it was used (models' last_used and idle_s).
_TOUCHED: weakref.WeakKeyDictionary[Service, dict[str, int]] = weakref.WeakKeyDictionary()


class ModelDemand(TypedDict):
    """model_demand's reply: where the alias stands after the call."""
    alias: str
    state: str  # starting | ready | unavailable
    booking: int | None
    server: int | None
    cards: list[int]
    message: str | None  # unavailable: one line a person acts on
    retry_after: int | None  # unavailable: seconds to free_at (1..3600), 60 when unknown
    free_at: int | None  # unavailable: the earliest start at which the group is free for ttl_s; None: none found


def entry_of(service: Service, alias: str) -> CatalogModel:
    """The catalog entry of `alias`; BadInput (exit 2) when the catalog has none."""
    for entry in service.config.models:
        if entry.alias == alias:
            return entry
    known = ", ".join(e.alias for e in service.config.models) or "none: the config has no [[models]]"
    raise BadInput(f"no model {alias[:80]!r} in the catalog ([[models]]); the catalog's aliases: {known}")


def runner_identity(service: Service) -> Identity | None:
    """The account on-demand bookings are held by ([llama] runner_user), or None where it has no account here."""
    uid = runner_uid(service)
    return None if uid is None else Identity(service.config.llama.runner_user, uid, False)


def live_booking(service: Service, alias: str, now: int) -> Booking | None:
    """The runner account's on-demand booking for `alias` that runs now (the one ending last, if several)."""
    uid = runner_uid(service)
    found = [b for b in booking_rows.live_between(service.conn, now, now + 1)
             if b.on_demand == alias and b.uid == uid and b.start <= now]
    return max(found, key=lambda b: b.end) if found else None


def within(service: Service, entry: CatalogModel) -> tuple[int, ...] | None:
    """The cards the entry's group comes from: its pool's; None: any card."""
    if entry.pool is None:
        return None
    return next((pool.cards for pool in service.config.pools if pool.name == entry.pool), ())


def group_size(service: Service, entry: CatalogModel) -> int | None:
    """How many cards the entry needs on this box (app.llama.catalog.cards_needed); None: no group fits."""
    from app.llama import catalog  # start-up: llama's modules load only for models

    cards = catalog.pool_cards(service.config, entry, service.fleet.latest().cards)
    return catalog.cards_needed(entry, catalog.card_memory(service.config, cards), service.config.fit)


def _lease_end(service: Service, entry: CatalogModel, now: int) -> int:
    return now + int(entry.ttl_s + service.config.gateway.drain_s)


# -- model_demand --------------------------------------------------------------------------------


def wake(service: Service, alias: str, used: bool = True) -> ModelDemand:
    """The alias's server starting or ready on a live on-demand booking (its lease extended), or a new booking with
    its plan; unavailable (nothing booked) when no runner is registered or no group is free now. `used`: a request
    asked (not a preload): the alias's last use is now."""
    entry = entry_of(service, alias)
    runner = runner_identity(service)
    with _WAKING:
        now = int(service.clock())
        if used:
            _TOUCHED.setdefault(service, {})[alias] = now
        drain = int(service.config.gateway.drain_s)
        booking = live_booking(service, alias, now)
        if booking is not None and (failure := start_failure(service, booking)) is not None:
            # Not kept, nor started again on it: its lease runs out, and the next demand after tries afresh.
            words = f"{alias} failed to start on cards {format_cards(booking.cards)} ({failure}); it is tried again" \
                    f" {stamp_when(booking.end, now)}"
            return _unavailable(alias, localize(words, policy_zone(service.config)), booking.end, now)
        booking = _keep(service, entry, booking, now)
        if booking is not None and booking.end - now > drain:  # one about to end that cannot grow: a new one elsewhere
            return _demand(service, entry, booking, now)
        registered = getattr(service, "runner", None)
        if runner is None or registered is None or registered.gone:
            who = service.config.llama.runner_user
            return _unavailable(alias, f"{alias} can't start: no runner is registered (board runner, as {who});"
                                       " ask an admin to start it")
        try:
            count = group_size(service, entry)
        except BadInput as unreadable:  # its file changed since the agent checked the catalog
            return _unavailable(alias, f"{alias} can't start: {unreadable}; ask an admin")
        if count is None:
            where = f"pool {entry.pool}'s cards" if entry.pool else "this box's cards"
            return _unavailable(alias, f"{alias} fits on no group of {where} (board fit); ask an admin to fix its"
                                       " [[models]] entry")
        rules = service.bookings(runner)
        rules.word_refusals = False  # the refusal is worded here, with the earliest start of the group
        try:
            made, _ = rules.book(count=count, start=now, end=_lease_end(service, entry, now), klass=entry.klass,
                                 project=entry.project, on_demand=alias, within=within(service, entry))
        except (Conflict, NotPermitted) as refused:
            return _refused(service, entry, runner, count, refused, now)
        spec = {"model": entry.model, "ctx": entry.ctx, "parallel": entry.parallel, "alias": alias,
                "cache_type_k": entry.cache_type_k, "cache_type_v": entry.cache_type_v, "extra": list(entry.args)}
        with write(service.conn):
            plan_id = plan_rows.insert(service.conn, booking_id=made.id, series_id=None, user=runner.name,
                                       uid=runner.uid, alias=alias, spec={k: spec[k] for k in SPEC_KEYS if k in spec},
                                       now=now)
            events.record(service.conn, ts=now, uid=runner.uid, actor=runner.name, action="server-plan",
                          booking_id=made.id, ok=True, details={"plan": plan_id, "model": entry.model, "alias": alias,
                                                                "on_demand": True})
        log.info(f"on demand: {alias} booked on cards {format_cards(made.cards)} (booking {made.id})")
        service.wake_enforcer.set()  # its start need not wait for the next pass
        return _demand(service, entry, made, now)


def _extended(service: Service, runner: Identity, booking: Booking, end: int) -> Booking:
    """The booking with its lease grown to `end` where it can (BookingService.lease caps it)."""
    if end <= booking.end:
        return booking
    return service.bookings(runner, booking=booking.id).lease(booking.id, end)


def _demand(service: Service, entry: CatalogModel, booking: Booking, now: int) -> ModelDemand:
    server = server_of(service, booking)
    ready = server is not None and server[1] == "ready"
    return {"alias": entry.alias, "state": "ready" if ready else "starting", "booking": booking.id,
            "server": server[0] if server else None, "cards": list(booking.cards), "message": None,
            "retry_after": None, "free_at": None}


def _unavailable(alias: str, message: str, free_at: int | None = None, now: int = 0) -> ModelDemand:
    retry = RETRY_UNKNOWN_S if free_at is None else min(RETRY_MAX_S, max(1, free_at - now))
    return {"alias": alias, "state": "unavailable", "booking": None, "server": None, "cards": [], "message": message,
            "retry_after": retry, "free_at": free_at}


def _refused(service: Service, entry: CatalogModel, runner: Identity, count: int, refused: BoardError,
             now: int) -> ModelDemand:
    """Unavailable, in words: who holds the cards (the booking rules' refusal) and the earliest start at which a
    group of `count` is free for ttl_s (their earliest-start search); a budget's refusal as it is."""
    from app.service.rules.bookings import _Scope  # the rules' planning scope: an on-demand booking's search

    rules = service.bookings(runner)
    pool = within(service, entry)
    try:  # the rules' own search, planning as for the booking: on demand, a group of the pool's cards
        with rules._planning(_Scope(True, frozenset(pool) if pool is not None else None)):
            plan = rules._earliest(cards=None, count=count, klass=entry.klass, start=now, duration=int(entry.ttl_s),
                                   project=entry.project or projects.IMPLICIT)
    except BoardError:
        plan = None
    found = plan.start if plan is not None else None
    group = f"{count} {'card' if count == 1 else 'cards'}" + (f" of pool {entry.pool}" if entry.pool else "")
    why = str(refused)
    if isinstance(refused, Conflict):
        held = why.partition(": ")[2]
        why = f"none are free now{f' ({held})' if held else ''}"
    earliest = (f"the earliest is {stamp_when(found, now)}" if found is not None
                else f"no start within {service.config.policy.max_ahead_days:g} days works")
    message = localize(f"{entry.alias} needs {group}; {why}; {earliest}", policy_zone(service.config))
    return _unavailable(entry.alias, message, found, now)


# -- models_touch --------------------------------------------------------------------------------


def touch(service: Service, aliases: Iterable[str]) -> dict[str, int]:
    """Each catalog alias the gateway used since its last flush: its live on-demand booking's lease grown to
    now + ttl_s + drain_s (capped by the next booking on its cards); {alias: its end}. An alias that is not in the
    catalog, or has no live booking, is left out: nothing of it runs to keep."""
    now = int(service.clock())
    touched = _TOUCHED.setdefault(service, {})
    extended: dict[str, int] = {}
    catalog = {entry.alias: entry for entry in service.config.models}
    for alias in dict.fromkeys(aliases):
        if (entry := catalog.get(alias)) is None:
            continue
        touched[alias] = now
        if (booking := _keep(service, entry, live_booking(service, alias, now), now)) is not None:
            extended[alias] = booking.end
    return extended


def _keep(service: Service, entry: CatalogModel, booking: Booking | None, now: int) -> Booking | None:
    """The entry's live on-demand booking (`booking`, None: none lives) with its lease grown to now + ttl_s + drain_s
    where it can."""
    runner = runner_identity(service)
    if booking is None or runner is None:
        return None
    return _extended(service, runner, booking, _lease_end(service, entry, now))


# -- preload -------------------------------------------------------------------------------------


def preloaded(window: PreloadWindow, now: int, tz) -> bool:
    """Whether `now` is inside the window: its hours (policy zone) on a day it names; a window that wraps midnight
    belongs to the day it opens on."""
    first, last = parse_hours(window.hours)
    days = parse_days(window.days)
    length = (last - first) % 1440 or 1440
    today = datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    for day in (today - timedelta(days=1), today):
        opens = day + timedelta(minutes=first)  # wall-clock: DST days are 23 or 25 hours
        if day.weekday() in days and opens.timestamp() <= now < (opens + timedelta(minutes=length)).timestamp():
            return True
    return False


def keep_pass(server: Agent) -> list[int]:
    """An enforcement pass's share: each entry with a preload window, inside it now, woken (no request needed) or
    its lease touched. Returns the bookings woken or kept. An entry that cannot start now is logged and tried again
    at the next pass."""
    service = server.service
    now = int(service.clock())
    tz = policy_zone(service.config)
    kept: list[int] = []
    for entry in service.config.models:
        if entry.preload is None or not preloaded(entry.preload, now, tz):
            continue
        try:
            if (booking := _keep(service, entry, live_booking(service, entry.alias, now), now)) is not None:
                # kept warm: not a use (last_used)
                kept.append(booking.id)
                continue
            demand = wake(service, entry.alias, used=False)
        except BoardError as error:
            log.warning(f"on demand: preload of {entry.alias} failed: {error}")
            continue
        if demand["booking"] is None:
            log.debug(f"on demand: preload of {entry.alias} waits: {demand['message']}")  # each pass: not logged
            continue
        audit(service, AGENT, "on-demand-preload", demand["booking"], ok=True, details={"alias": entry.alias})
        kept.append(demand["booking"])
    return kept


# -- models --------------------------------------------------------------------------------------


def server_of(service: Service, booking: Booking) -> tuple[int, str] | None:
    """(id, state) of the server the booking's on-demand plan started, or None while it has not."""
    from app.llama import rows as servers  # start-up: llama's modules load only for servers

    run = plan_rows.run_on(service.conn, booking.id)
    if run is None or run["server"] is None:
        return None
    row = servers.get(service.conn, run["server"])
    return (row.id, row.state) if row else None


def start_failure(service: Service, booking: Booking) -> str | None:
    """Why the booking's on-demand server is not running, where its start failed: the plan's refusal (the rules
    refused the start) or the server's end (failed or crashed), as its row says; None: none failed."""
    run = plan_rows.run_on(service.conn, booking.id)
    if run is None:
        return None
    if run["error"]:
        return str(run["error"])
    if run["server"] is None:
        return None
    from app.llama import rows as servers  # start-up: llama's modules load only for servers

    row = servers.get(service.conn, run["server"])
    if row is None or row.state not in (servers.FAILED, servers.CRASHED):
        return None
    return f"server {row.id} {row.state}{f': {row.reason}' if row.reason else ''}"


# One catalog entry as `models` shows it (functional form: `class` is a keyword).
ModelWire = TypedDict("ModelWire", {
    "alias": str, "model": str, "pool": str | None, "project": str, "class": str, "ttl_s": float,
    "preload": dict[str, str] | None, "fallbacks": list[str], "cards_needed": int | None,
    "state": str,  # cold | starting | ready | draining | failed
    "preloaded": bool,  # inside its preload window now
    "booking": int | None, "server": int | None, "cards": list[int],
    "since": int | None,  # its booking's start
    "last_used": int | None, "idle_s": int | None,
    "requests_today": int, "tokens_today": int})  # since the policy zone's midnight (gateway_usage)


def models_view(service: Service, me: Identity) -> list[ModelWire]:
    """Each catalog entry, in catalog order, with where it stands now."""
    now = int(service.clock())
    tz = policy_zone(service.config)
    drain = service.config.gateway.drain_s
    since = projects.day(now, tz)[0]
    today = {row["model"]: (row["requests"], row["prompt_tokens"] + row["completion_tokens"])
             for row in key_rows.usage(service.conn, since, "model")}
    touched = _TOUCHED.get(service, {})
    found: list[ModelWire] = []
    for entry in service.config.models:
        booking = live_booking(service, entry.alias, now)
        server = server_of(service, booking) if booking is not None else None
        state = "cold"
        if booking is not None:
            if start_failure(service, booking) is not None:
                state = "failed"
            elif booking.end - now <= drain or (server is not None and server[1] == "stopping"):
                state = "draining"
            elif server is not None and server[1] == "ready":
                state = "ready"
            else:
                state = "starting"
        last_used = touched.get(entry.alias)
        if last_used is None:
            last_used = key_rows.last_request(service.conn, entry.alias)
        requests, tokens = today.get(entry.alias, (0, 0))
        try:
            needed = group_size(service, entry)
        except BoardError:
            needed = None
        found.append({
            "alias": entry.alias, "model": entry.model, "pool": entry.pool, "project": entry.project or "",
            "class": entry.klass, "ttl_s": entry.ttl_s,
            "preload": {"hours": entry.preload.hours, "days": entry.preload.days} if entry.preload else None,
            "fallbacks": list(entry.fallbacks), "cards_needed": needed, "state": state,
            "preloaded": entry.preload is not None and preloaded(entry.preload, now, tz),
            "booking": booking.id if booking else None, "server": server[0] if server else None,
            "cards": list(booking.cards) if booking else [], "since": booking.start if booking else None,
            "last_used": last_used, "idle_s": max(0, now - last_used) if last_used is not None else None,
            "requests_today": requests, "tokens_today": int(tokens)})
    return found

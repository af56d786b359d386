"""A request in memory terms (model, context, slots, cache types) against cards: how many to book, whether a
server's settings fit the cards it was given, and what a booking stores of it.

Runs in the member's own process: the model file is theirs to read (the service never opens a path a
client sent), so these checks keep honest members from mistakes; the card table flags whoever uses
more than they asked for.
"""

from __future__ import annotations

from app.errors import NotPermitted
from app.fit.estimate import Placement, Settings, place
from app.fit.gguf_model import Model, read_model
from app.fit.report import DEFAULT_CARD_MIB, alternatives, fit, overflow, request_record


def limits(config) -> dict:
    settings = config.fit
    return {"card_mib": settings.card_mib or DEFAULT_CARD_MIB, "overhead_mib": settings.overhead_mib,
            "max_fill": settings.max_fill}


def _refusal(model: Model, settings: Settings, placement: Placement, bounds: dict, action: str) -> NotPermitted:
    instead = alternatives(model, settings, placement.cards, **bounds)
    hint = f"; would fit: {' or '.join(instead)}" if instead else "; nothing smaller fits: use a smaller quantisation"
    return NotPermitted(f"{action}: {model.path.rsplit('/', 1)[-1]} does not fit: {overflow(placement)}{hint}")


def for_booking(path: str, settings: Settings, bounds: dict, *, count: int | None, cards: list[int] | None) -> tuple[int, dict]:
    """(how many cards, the request to store). Without a count or cards, the smallest group that fits."""
    model = read_model(path)
    if cards is not None:
        n = len(cards)
    elif count is not None:
        n = count
    else:
        smallest = fit(model, settings, **bounds).smallest_fit
        if smallest is None:
            raise _refusal(model, settings, place(model, settings, 8, **bounds), bounds, "book")
        n = smallest
    placement = place(model, settings, n, **bounds)
    if not placement.fits:
        raise _refusal(model, settings, placement, bounds, "book")
    return n, request_record(placement, model, settings)


def for_server(model: Model, settings: Settings, bounds: dict, cards: int, *, force: bool,
               command: str = "serve start") -> dict:
    """The estimate for a server on `cards` cards; NotPermitted (naming `command`) when it does not fit, unless
    forced. What it returns goes into the audit row of the start."""
    placement = place(model, settings, cards, **bounds)
    if not placement.fits and not force:
        raise _refusal(model, settings, placement, bounds, command)
    record = request_record(placement, model, settings)
    return {"per_card_mib": record["per_card_mib"], "limit_mib": round(placement.limit_mib),
            "fits": placement.fits, "forced": force and not placement.fits}


def settings_of(request: dict | None, **given) -> Settings:
    """A server's settings: what was given, else the booking's stored request, else the defaults."""
    request = request or {}
    values = {}
    for key in ("ctx", "parallel", "cache_type_k", "cache_type_v", "flash_attn", "unified"):
        value = given.get(key)
        if value is None:
            value = request.get(key)
        if value is not None:
            values[key] = value
    return Settings(**values)  # each value is well-formed: a stored one comes through app.core.request.readable

"""The `faults` operation: what the service recorded of Xid events, OOM exits and thermal throttling (app.faults).

Read-only, for any member: the faults concern the shared cards, not anyone's private data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict, cast

from app.core.identity import Identity
from app.errors import BadInput
from app.faults import store
from app.service.ops.registry import Request, Time, op

if TYPE_CHECKING:
    from app.service import Service

LIMIT = 10_000


class Faults(Request, frozen=True):
    since: Time
    kind: str | None = None  # one of app.faults.store.KINDS; None: every kind


class FaultWire(TypedDict):
    """A recorded fault (app.faults.store.Fault) and its card's index where the fleet knows it."""
    id: int
    ts: int
    card_uuid: str | None
    kind: str
    code: int | None
    detail: str
    duration_s: float | None
    booking_id: int | None
    user: str | None
    card: int | None


class FaultsReply(TypedDict):
    since: int
    counts: dict[str, int]  # by kind, over the same window
    faults: list[FaultWire]  # newest first


@op("faults", Faults)
def faults(service: Service, me: Identity, request: Faults) -> FaultsReply:
    """The faults since `since` (epoch seconds), newest first, with the card's index where the fleet knows it,
    and the counts by kind over the same window."""
    since, kind = request.since, request.kind
    if kind is not None and kind not in store.KINDS:
        raise BadInput(f"fault kind must be one of {', '.join(store.KINDS)}, not {kind[:20]!r}")
    kinds = None if kind is None else [kind]
    index = {card.uuid: card.index for card in service.fleet.latest().cards}  # the shared, cached reading
    found = store.recent(service.conn, since, kinds, limit=LIMIT)
    counts = {k: store.count(service.conn, since, [k]) for k in (kinds or store.KINDS)}
    return {"since": since, "counts": counts,
            "faults": [cast(FaultWire, {**f.to_json(), "card": index.get(f.card_uuid) if f.card_uuid else None})
                       for f in found]}

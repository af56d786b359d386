"""The `alerts` operation (any member): the alerts firing now, or with `all` the resolved ones too; a per-user
alert (a booking ending soon) only to its user. The rules and the engine are app.alerts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, TypedDict, cast

import msgspec

from app.core.identity import Identity
from app.service.ops.registry import Request, op

if TYPE_CHECKING:
    from app.service import Service


class Alerts(Request, frozen=True):
    all: bool = False  # the resolved ones too
    limit: Annotated[int, msgspec.Meta(ge=1, le=10_000, description="a count from 1 to 10000")] = 200


class Alert(TypedDict):
    id: int
    rule: str
    subject: str
    state: str  # firing or resolved
    fired_at: int
    resolved_at: int | None
    last_seen: int
    message: str
    uid: int | None  # a per-user alert's user; None: the team's


@op("alerts", Alerts)
def alerts(service: Service, me: Identity, request: Alerts) -> list[Alert]:
    from app.alerts.engine import listing  # start-up: only this operation loads the alerts engine

    # The engine reads the alerts table's columns: an Alert each.
    return cast(list[Alert], listing(service.conn, me, all=request.all, limit=request.limit))

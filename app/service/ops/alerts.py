"""The `alerts` operation (any member): the alerts firing now, or with `all` the resolved ones too; a per-user
alert (a booking ending soon) only to its user. The rules and the engine are app.alerts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.identity import Identity
from app.errors import BadInput
from app.service.ops.registry import BOOL, INT, op

if TYPE_CHECKING:
    from app.service import Service


@op("alerts", {}, {"all": BOOL, "limit": INT})
def alerts(service: Service, me: Identity, all: bool = False, limit: int = 200) -> list:
    from app.alerts.engine import listing  # start-up: only this operation loads the alerts engine

    if not 0 < limit <= 10_000:
        raise BadInput("alerts: limit is from 1 to 10000")
    return listing(service.conn, me, all=all, limit=limit)

"""The alerts' pass in the service: the engine (app.alerts.engine) decides what fires and resolves, and this side
puts the pushes it asks for in the outbox, in the pass's own transaction, and tells the holders of per-user
alerts after it. The enforcer's pass runs it (app.service.box.enforce)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.alerts.engine import Engine, gather
from app.alerts.rules import Inputs
from app.service.box.notify import push
from app.store.db import write

if TYPE_CHECKING:
    from app.service import Service
    from app.service.conn.agent import Agent


def alerts_pass(service: Service, engine: Engine, inputs: Inputs | None = None, *,
                told: frozenset[str] = frozenset()) -> dict[str, list[int]]:
    """One pass of `engine` over `inputs` (by default what the service sees now); the alert ids fired, resolved
    and pushed."""
    now = service.clock()
    if inputs is None:
        inputs = gather(service.conn, service.fleet.latest(), service.history, service.config, now)
    with write(service.conn):
        done = engine.run(service.conn, service.config, now, inputs, told=told)
        for wanted in done.pushes:
            push(service, wanted.kind, wanted.title, fields=wanted.fields, key=wanted.key)
    for uid, message in done.notices:
        service.hub.publish("notice", {"message": message}, uid=uid)
    return done.ids()


def enforcer_alerts(server: Agent) -> dict[str, list[int]]:
    """The enforcer pass's hook: one pass of the server's engine, if alerts are on."""
    if not server.service.config.alerts.enabled:
        return {}
    told = frozenset(f"booking:{e.booking_id}" for e in server.service.processes.live() if e.kind != "server" and e.warned)
    return alerts_pass(server.service, server.alerts, told=told)

"""The llama-server operations: serve_start, serve_get, serve_list, serve_logs, serve_stop, serve_key.

The rules are app.llama.service (ServerService), bound to the service by app.service.box.servers, which
also supervises the registered servers behind the socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, TypedDict

import msgspec

from app.core.identity import Identity
from app.service.box.servers import changed, light_rules, server_rules
from app.service.ops.registry import ById, Int, Request, op
from app.store import bookings as rows

if TYPE_CHECKING:
    from app.llama.rows import Server, ServerWire
    from app.service import Service
    from app.service.rules.plans import PlanWire


def _wire(server: Server, me: Identity) -> ServerWire:
    """A server for `me`: where its log file lies is its holder's to know, its last lines its holder's and admins'
    (as in serve_logs)."""
    from app.llama.rows import server_to_wire  # start-up: llama's modules load only for servers

    wired = server_to_wire(server)
    if server.uid != me.uid:
        wired["log_path"] = ""
        if not me.is_admin:  # the log's last lines are its holder's and admins' (serve_logs)
            wired["log_tail"] = []
    return wired


class ServerSpec(Request, frozen=True):
    """How to run a server, serve_start's and serve_plan's: what is not given comes from the booking's request or
    the defaults (ServerService.prepare checks the values)."""
    model: str | None = None
    ctx: Int | None = None
    parallel: Int | None = None
    split_mode: str | None = None
    tensor_split: str | None = None
    metrics: bool | None = None
    alias: str | None = None
    host: str | None = None
    extra: list[str] | None = None  # further llama-server flags
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: str | None = None  # on or off
    fit: dict[str, Any] | None = None  # the estimate the caller's process made (app.llama.service.checked_estimate)

    def given(self, *leave: str) -> dict[str, Any]:
        """The fields given (not None) as keywords, less those named."""
        return {name: value for name in self.__struct_fields__ if name not in leave
                and (value := getattr(self, name)) is not None}


class ServeStart(ServerSpec, frozen=True, kw_only=True):
    booking: Int
    port: Int | None = None  # None: a free one of the server range


class Launch(TypedDict):
    """What the caller's process needs to launch the server as itself (app.llama.launch)."""
    ready_timeout_s: float
    model_dirs: list[str]  # where the supervisor may open a file flag's file
    db: str | None  # the store the supervisor reports to in file mode; None behind the socket


class Started(TypedDict):
    server: ServerWire
    launch: Launch


@op("serve_start", ServeStart)
def serve_start(service: Service, me: Identity, request: ServeStart) -> Started:
    """Check and lease; returns the row and what the caller needs to launch it as itself (app.llama.launch)."""
    booking = request.booking
    if (held := rows.get(service.conn, booking)) is not None:
        from app.service.fleet.hosts import refuse_remote  # start-up: only serve_start asks where the cards are

        refuse_remote(service, held)
    try:
        server = server_rules(service, me).prepare(booking, **request.given("booking"))
    finally:
        changed(service)
    return {"server": _wire(server, me), "launch": {
        "ready_timeout_s": service.config.llama.ready_timeout_s,
        "model_dirs": list(service.config.llama.model_dirs),  # where the supervisor may open a file flag's file
        # The store the supervisor reports to in file mode: the SQLite file, or the PostgreSQL url.
        "db": (service.config.storage_url or str(service.config.db_path)) if service.transport == "local" else None}}


@op("serve_get", ById)
def serve_get(service: Service, me: Identity, request: ById) -> ServerWire:
    """One server, reconciled first (a supervisor that died shows as crashed)."""
    rules = light_rules(service, me)
    before = rules.get(request.id)
    after = rules._reconcile_one(before)
    if after.state != before.state:
        changed(service)
    return _wire(after, me)


class ServeList(Request, frozen=True):
    all: bool = False  # the ended ones too
    user: str | None = None  # one holder's; None: everyone's
    limit: Int | None = None


@op("serve_list", ServeList)
def serve_list(service: Service, me: Identity, request: ServeList) -> list[ServerWire]:
    rules = light_rules(service, me)
    if rules.reconcile():
        changed(service)
    from app.llama import rows  # start-up: llama's modules load only for servers

    found = rows.listing(service.conn, live_only=not request.all, user=request.user, limit=request.limit)
    return [_wire(s, me) for s in found]


class ServeLogs(Request, frozen=True):
    id: Int
    lines: Annotated[int, msgspec.Meta(ge=0, le=100_000, description="a count from 0 to 100000")] = 50


class Logs(TypedDict):
    lines: list[str]  # the last ones
    state: str
    live: bool
    log: str | None  # the file's path, for the holder whose own process wrote it


@op("serve_logs", ServeLogs)
def serve_logs(service: Service, me: Identity, request: ServeLogs) -> Logs:
    """The server's last lines; `log` is its file's path only for its owner, whose own process wrote it."""
    from app.store.plans import plan_of_server  # start-up: plans load only for servers

    rules = light_rules(service, me)
    server = rules.get(request.id)
    rules.holder_or_admin(server, "server-logs", "read its log")
    # The path only where the holder's own process wrote the file: a planned server's log is the runner's.
    own = server.uid == me.uid and server.log_path and plan_of_server(service.conn, server.id) is None
    return {"lines": rules.log_lines(server, request.lines), "state": server.state, "live": server.live,
            "log": server.log_path if own else None}


class ServeStop(Request, frozen=True):
    id: Int
    reason: str | None = None  # kept to 200 characters


@op("serve_stop", ServeStop)
def serve_stop(service: Service, me: Identity, request: ServeStop) -> ServerWire:
    """Stop a server (its holder or an admin; refusals audited). Behind the socket it returns `stopping`."""
    rules = light_rules(service, me)
    try:
        return _wire(rules.stop(request.id, reason=request.reason[:200] if request.reason else None), me)
    finally:
        changed(service)


class ServerKey(TypedDict):
    id: int
    key: str | None


@op("serve_key", ById)
def serve_key(service: Service, me: Identity, request: ById) -> ServerKey:
    """The server's own API key, for its holder and admins (the only operation that returns it)."""
    return {"id": request.id, "key": light_rules(service, me).api_key(request.id)}


# -- planned servers (app.service.rules.plans) ----------------------------------------------------------

class ServePlan(ServerSpec, frozen=True):
    """A server spec for a booking or a series, one of them; a planned server leases a port when it starts."""
    booking: Int | None = None
    series: Int | None = None
    project: str | None = None  # --project: a plan serves its booking's project, so only that one


@op("serve_plan", ServePlan)
def serve_plan(service: Service, me: Identity, request: ServePlan) -> PlanWire:
    """Attach a server spec to the caller's booking, or to every occurrence of their series."""
    from app.service.rules import plans  # start-up: plans load only for servers

    try:
        return plans.create(service, me, booking=request.booking, series=request.series,
                            spec=request.given("booking", "series", "project"), project=request.project)
    finally:
        changed(service)


class ServePlans(Request, frozen=True):
    all: bool = False  # the cancelled ones too


@op("serve_plans", ServePlans)
def serve_plans(service: Service, me: Identity, request: ServePlans) -> list[PlanWire]:
    """Live plans (everyone's: the team sees what will be served), with each one's next start; `all`: cancelled too."""
    from app.service.rules import plans  # start-up: plans load only for servers
    from app.store import plans as plan_rows  # start-up: plans load only for servers

    return [plans.plan_wire(service, p) for p in plan_rows.listing(service.conn, cancelled=request.all)]


@op("serve_plan_cancel", ById)
def serve_plan_cancel(service: Service, me: Identity, request: ById) -> PlanWire:
    """Cancel a plan (its holder or an admin): no further starts; a server it already started runs to its end."""
    from app.service.rules import plans  # start-up: plans load only for servers

    try:
        return plans.cancel(service, me, request.id)
    finally:
        changed(service)

"""The llama-server operations: serve_start, serve_get, serve_list, serve_logs, serve_stop, serve_key.

The rules are app.llama.service (ServerService), bound to the service by app.service.box.servers, which
also supervises the registered servers behind the socket.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.core.identity import Identity
from app.errors import BadInput
from app.service.ops.registry import BOOL, DICT, INT, LIST, STR, op
from app.service.box.servers import changed, light_rules, server_rules
from app.store import bookings as rows

if TYPE_CHECKING:
    from app.llama.rows import Server
    from app.service import Service


def _wire(server: Server, me: Identity) -> dict:
    """A server for `me`: where its log file lies is its holder's to know, its last lines its holder's and admins'
    (as in serve_logs)."""
    from app.llama.rows import server_to_wire  # start-up: llama's modules load only for servers

    wired = server_to_wire(server)
    if server.uid != me.uid:
        wired["log_path"] = ""
        if not me.is_admin:  # the log's last lines are its holder's and admins' (serve_logs)
            wired["log_tail"] = []
    return wired


_START = {"model": STR, "ctx": INT, "parallel": INT, "port": INT, "split_mode": STR, "tensor_split": STR,
          "metrics": BOOL, "alias": STR, "host": STR, "extra": LIST, "cache_type_k": STR, "cache_type_v": STR,
          "flash_attn": STR, "fit": DICT}


@op("serve_start", {"booking": INT}, _START, writes=True)
def serve_start(service: Service, me: Identity, booking: int, extra=None, **options) -> dict:
    """Check and lease; returns the row and what the caller needs to launch it as itself (app.llama.launch)."""
    if extra is not None and not all(isinstance(a, str) for a in extra):
        raise BadInput("serve_start: extra is a list of strings")
    if (held := rows.get(service.conn, booking)) is not None:
        from app.service.fleet.hosts import refuse_remote  # start-up: only serve_start asks where the cards are

        refuse_remote(service, held)
    try:
        server = server_rules(service, me).prepare(booking, extra=extra or (), **options)
    finally:
        changed(service)
    return {"server": _wire(server, me), "launch": {
        "ready_timeout_s": service.config.llama.ready_timeout_s,
        "model_dirs": list(service.config.llama.model_dirs),  # where the supervisor may open a file flag's file
        # The store the supervisor reports to in file mode: the SQLite file, or the PostgreSQL url.
        "db": (service.config.storage_url or str(service.config.db_path)) if service.transport == "local" else None}}


@op("serve_get", {"id": INT})
def serve_get(service: Service, me: Identity, id: int) -> dict:
    """One server, reconciled first (a supervisor that died shows as crashed)."""
    rules = light_rules(service, me)
    before = rules.get(id)
    after = rules._reconcile_one(before)
    if after.state != before.state:
        changed(service)
    return _wire(after, me)


@op("serve_list", {}, {"all": BOOL, "user": STR, "limit": INT})
def serve_list(service: Service, me: Identity, all=False, user=None, limit=None) -> list:
    rules = light_rules(service, me)
    if rules.reconcile():
        changed(service)
    from app.llama import rows  # start-up: llama's modules load only for servers

    found = rows.listing(service.conn, live_only=not all, user=user, limit=limit)
    return [_wire(s, me) for s in found]


@op("serve_logs", {"id": INT}, {"lines": INT})
def serve_logs(service: Service, me: Identity, id: int, lines: int = 50) -> dict:
    """The server's last lines; `log` is its file's path only for its owner, whose own process wrote it."""
    if not 0 <= lines <= 100_000:
        raise BadInput("lines: a count from 0 to 100000")
    from app.store.plans import plan_of_server  # start-up: plans load only for servers

    rules = light_rules(service, me)
    server = rules.get(id)
    rules.holder_or_admin(server, "server-logs", "read its log")
    # The path only where the holder's own process wrote the file: a planned server's log is the runner's.
    own = server.uid == me.uid and server.log_path and plan_of_server(service.conn, server.id) is None
    return {"lines": rules.log_lines(server, lines), "state": server.state, "live": server.live,
            "log": server.log_path if own else None}


@op("serve_stop", {"id": INT}, {"reason": STR}, writes=True)
def serve_stop(service: Service, me: Identity, id: int, reason=None) -> dict:
    """Stop a server (its holder or an admin; refusals audited). Behind the socket it returns `stopping`."""
    rules = light_rules(service, me)
    try:
        return _wire(rules.stop(id, reason=reason[:200] if reason else None), me)
    finally:
        changed(service)


@op("serve_key", {"id": INT})
def serve_key(service: Service, me: Identity, id: int) -> dict:
    """The server's own API key, for its holder and admins (the only operation that returns it)."""
    return {"id": id, "key": light_rules(service, me).api_key(id)}


# -- planned servers (app.service.rules.plans) ----------------------------------------------------------

_PLAN = {k: v for k, v in _START.items() if k != "port"}  # a planned server leases a port when it starts


@op("serve_plan", {}, {"booking": INT, "series": INT, **_PLAN}, writes=True)
def serve_plan(service: Service, me: Identity, booking=None, series=None, extra=None, **options) -> dict:
    """Attach a server spec to the caller's booking, or to every occurrence of their series."""
    from app.service.rules import plans  # start-up: plans load only for servers

    if extra is not None and not all(isinstance(a, str) for a in extra):
        raise BadInput("serve_plan: extra is a list of strings")
    try:
        return plans.create(service, me, booking=booking, series=series, spec={**options, "extra": extra})
    finally:
        changed(service)


@op("serve_plans", {}, {"all": BOOL})
def serve_plans(service: Service, me: Identity, all=False) -> list:
    """Live plans (everyone's: the team sees what will be served), with each one's next start; `all`: cancelled too."""
    from app.service.rules import plans  # start-up: plans load only for servers
    from app.store import plans as plan_rows  # start-up: plans load only for servers

    return [plans.plan_wire(service, p) for p in plan_rows.listing(service.conn, cancelled=all)]


@op("serve_plan_cancel", {"id": INT}, writes=True)
def serve_plan_cancel(service: Service, me: Identity, id: int) -> dict:
    """Cancel a plan (its holder or an admin): no further starts; a server it already started runs to its end."""
    from app.service.rules import plans  # start-up: plans load only for servers

    try:
        return plans.cancel(service, me, id)
    finally:
        changed(service)

"""Servers that follow the calendar: the rules of `board serve plan`, and the runner that starts them.

    board serve plan 42 --model M --alias A ──serve_plan──▶ a plan (app.store.plans): the spec, checked now
    board runner (user board-llama) ──register kind "runner"──▶ the service keeps its connection
    each enforcement pass: an occurrence whose booking is active and not yet started ──▶ ServerService.prepare
        as the booking's holder (the row is theirs: port lease, audit) ──▶ {"event": "start"} to the runner
    the runner spawns the supervisor as itself (app.llama.launch) ──▶ it registers kind "server" like any other;
        the service accepts the runner's uid for a row a plan started (may_supervise)
    the booking's end ──▶ the enforcement stops it through the supervisor's pidfd, as every server

The runner has no privilege: it reads `[llama] model_dirs` (a plan's model must lie there) and nothing
of the database. Only the uid of `[llama] runner_user` may register as the runner; one at a time.
"""

from __future__ import annotations

import logging
import os
import pwd
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict

from app import wire
from app.core.identity import Identity
from app.errors import BadInput, BoardError, Conflict, NotPermitted
from app.service.rules.audit import AGENT, audit
from app.service.fleet.hosts import here, refuse_remote
from app.store import bookings as booking_rows
from app.store import events
from app.store import plans as plan_rows
from app.store import series as series_rows
from app.store.db import write

if TYPE_CHECKING:
    import socket

    from app.service import Service
    from app.service.conn.agent import Agent
    from app.service.conn.deadline import Lines
    from app.service.conn.peer import Peer

# service.runner changes under this: a runner registering and one going away. Registrations are rare, so one
# lock serves every service in the process.
_RUNNER_SLOT = threading.Lock()

SPEC_KEYS = ("model", "ctx", "parallel", "split_mode", "tensor_split", "metrics", "alias", "host", "extra",
             "cache_type_k", "cache_type_v", "flash_attn", "fit")

log = logging.getLogger(__name__)


def runner_uid(service: Service) -> int | None:
    try:
        return pwd.getpwnam(service.config.llama.runner_user).pw_uid
    except KeyError:
        return None


# -- plans ---------------------------------------------------------------------------------------


def create(service: Service, me: Identity, *, booking: int | None, series: int | None, spec: dict,
           project: str | None = None) -> PlanWire:
    """A plan for the caller's booking (not ended) or series; the spec checked as `serve start` checks it. A server
    serves its booking's project: `project` (--project), when given, must be that one."""
    from app.llama import aliases  # start-up: llama's modules load only for servers
    from app.llama import command as cmd  # start-up: llama's modules load only for servers
    from app.llama.service import checked_estimate  # start-up: llama's modules load only for servers

    if (booking is None) == (series is None):
        raise BadInput("serve plan: give a booking or --series")
    now = int(service.clock())
    if booking is not None:
        found = booking_rows.get(service.conn, booking)
        if found is None:
            raise BadInput(f"no booking {booking}; 'board list --mine' shows your bookings")
        if found.uid != me.uid:
            _refused(service, me, booking, NotPermitted(f"booking {booking} belongs to {found.user}"))
        if found.status != "booked" or found.end <= now:
            raise BadInput(f"booking {booking} is {'cancelled' if found.status != 'booked' else 'over'}")
        refuse_remote(service, found, "plan")
        cards: int | None = len(found.cards)
        serves, what = found.project, f"booking {booking}"
    else:
        assert series is not None  # one of the two: checked first
        found = None
        found_series = series_rows.get(service.conn, series)
        if found_series is None:
            raise BadInput(f"no series {series}; 'board series list' shows them")
        if found_series.uid != me.uid:
            _refused(service, me, None, NotPermitted(f"series {series} belongs to {found_series.user}"))
        first = series_rows.first_occurrence(service.conn, series)
        if first is not None and (occurrence := booking_rows.get(service.conn, first)) is not None:
            refuse_remote(service, occurrence, "plan")
        cards = len(found_series.rule.get("cards") or []) or None
        serves, what = found_series.rule.get("project") or "", f"series {series}"
    if project is not None and project != serves:
        held = f"is for project {serves}" if serves else "is for no project"
        raise BadInput(f"{what} {held}, not {project[:40]!r}: a planned server serves its booking's project; leave"
                       " out --project")
    model = spec.get("model")
    if not model:
        raise BadInput("serve plan: say which model: --model PATH.gguf")
    model = cmd.model_argument(model)
    dirs = [os.path.normpath(d) for d in service.config.llama.model_dirs]
    if not any(Path(model).is_relative_to(d) for d in dirs):
        where = ", ".join(dirs) or "none configured"
        raise BadInput(f"a planned server's model must lie in [llama] model_dirs ({where}): the runner reads only those")
    extra = cmd.check_extra(spec.get("extra") or [], service.config.llama.model_dirs)
    host = spec.get("host") or service.config.llama.host
    if host not in service.config.llama.allowed_hosts:
        raise NotPermitted(f"host {host} is not allowed; the config allows {', '.join(service.config.llama.allowed_hosts)}")
    if spec.get("fit") is not None and cards:
        checked_estimate(spec["fit"], cards)
    alias = spec.get("alias") or Path(model).stem
    kept = {k: v for k, v in spec.items() if k in SPEC_KEYS and v is not None}
    kept.update(model=model, alias=alias, extra=extra)
    # The alias is no other member's over the plan's bookings (app.llama.aliases): checked under the write lock, so
    # that two plans cannot both take it.
    try:
        with write(service.conn):
            if found is not None:
                spans = [(found.start, found.end)]
            else:
                assert series is not None  # a series' plan: one of the two, checked first
                spans = [(b.start, b.end) for b in series_rows.occurrences(service.conn, series)
                         if b.status == "booked" and b.end > now]
            aliases.check(service.conn, service.config, user=me.name, uid=me.uid, alias=alias, spans=spans, now=now,
                          defaulted=not spec.get("alias"))
            plan_id = plan_rows.insert(service.conn, booking_id=booking, series_id=series, user=me.name, uid=me.uid,
                                       alias=alias, spec=kept, now=now)
            events.record(service.conn, ts=now, uid=me.uid, actor=me.name, action="server-plan", booking_id=booking,
                          ok=True, details={"plan": plan_id, "series": series, "model": model, "alias": alias})
    except (NotPermitted, Conflict) as refusal:
        _refused(service, me, booking, refusal)
    return _plan_wire_of(service, plan_id)


def cancel(service: Service, me: Identity, plan_id: int) -> PlanWire:
    plan = plan_rows.get(service.conn, plan_id)
    if plan is None:
        raise BadInput(f"no planned server {plan_id}; 'board serve plan --list' shows them")
    if plan.uid != me.uid and not me.is_admin:
        _refused(service, me, plan.booking_id, NotPermitted(f"planned server {plan_id} belongs to {plan.user}"))
    now = int(service.clock())
    with write(service.conn):
        plan_rows.cancel(service.conn, plan_id, now)
        events.record(service.conn, ts=now, uid=me.uid, actor=me.name, action="server-plan-cancel",
                      booking_id=plan.booking_id, ok=True, details={"plan": plan_id})
    return _plan_wire_of(service, plan_id)


def _plan_wire_of(service: Service, plan_id: int) -> PlanWire:
    """The plan as a change just left it (a change never deletes one)."""
    plan = plan_rows.get(service.conn, plan_id)
    assert plan is not None  # the change's own row, just written
    return plan_wire(service, plan)


class PlanWire(TypedDict):
    """A planned server as serve_plan, serve_plans and serve_plan_cancel return it."""
    id: int
    booking: int | None  # a booking's plan, or a series' (one of the two)
    series: int | None
    user: str
    alias: str
    model: str | None
    ctx: int | None
    parallel: int | None
    created: int
    cancelled: int | None
    next_start: int | None  # its next occurrence's start; None: none is coming
    next_booking: int | None
    refused: dict[str, Any] | None  # why its latest start gave no server: {booking, error}


def plan_wire(service: Service, plan: plan_rows.Plan) -> PlanWire:
    upcoming = plan_rows.upcoming(service.conn, int(service.clock()), plan_id=plan.id)
    return {"id": plan.id, "booking": plan.booking_id, "series": plan.series_id, "user": plan.user,
            "alias": plan.alias, "model": plan.spec.get("model"), "ctx": plan.spec.get("ctx"),
            "parallel": plan.spec.get("parallel"), "created": plan.created_at, "cancelled": plan.cancelled_at,
            "next_start": upcoming[0]["start"] if upcoming else None,
            "next_booking": upcoming[0]["booking"] if upcoming else None,
            "refused": plan_rows.last_refusal(service.conn, plan.id)}  # why its latest start gave no server


def _refused(service: Service, me: Identity, booking_id: int | None, refusal: BoardError) -> NoReturn:
    audit(service, me, "server-plan", booking_id, ok=False, details={"refused": str(refusal)})
    raise refusal


# -- the runner ----------------------------------------------------------------------------------


class Runner:
    """The one registered runner's connection: start instructions go down it as JSON lines."""

    def __init__(self, conn: socket.socket, pid: int) -> None:
        self.conn, self.pid = conn, pid
        self.lock = threading.Lock()
        self.gone = False

    def send(self, message: dict) -> bool:
        with self.lock:
            if self.gone:
                return False
            try:
                self.conn.sendall(wire.encode(message))
                return True
            except OSError:
                self.gone = True
                return False


def runner_registration(server: Agent, conn: socket.socket, reader: Lines, peer: Peer, request_id: Any,
                        args: dict) -> None:
    """`board runner` registers (kind "runner") and keeps the connection open; only [llama] runner_user's uid."""
    service = server.service
    if peer.uid != runner_uid(service):
        server.reply(conn, request_id, error=NotPermitted(
            f"only the user {service.config.llama.runner_user} runs planned servers"))
        return
    runner = Runner(conn, peer.pid)
    with _RUNNER_SLOT:
        current = getattr(service, "runner", None)
        if current is not None and not current.gone:
            server.reply(conn, request_id, error=NotPermitted("a runner is registered already"))
            return
        service.runner = runner
    server.reply(conn, request_id, {"runner": peer.pid})
    log.info(f"board agent: runner registered (pid {peer.pid})")
    service.wake_enforcer.set()  # an occurrence that is due now need not wait for the next pass
    try:
        while line := reader.readline(None):  # its line stays open while it lives
            _runner_said(server, line)
    except OSError:
        pass
    runner.gone = True
    with _RUNNER_SLOT:
        if service.runner is runner:
            service.runner = None
    log.warning(f"board agent: runner (pid {peer.pid}) went away")


def _runner_said(server: Agent, line: bytes) -> None:
    """The runner's one report: a server it was told to start and could not (its supervisor never ran), so
    the row says why rather than, later, 'exit status unknown'. Only a `starting` row a plan started that no
    supervisor has registered for."""
    try:
        message = wire.decode(line)
        server_id, reason = message["server"], str(message["reason"])[:200]
    except (ValueError, KeyError, TypeError):
        return
    if message.get("event") != "failed" or not isinstance(server_id, int) or isinstance(server_id, bool):
        return

    def record() -> None:
        from app.llama import rows  # start-up: llama's modules load only for servers
        from app.llama.service import ServerService  # start-up: llama's modules load only for servers

        service = server.service
        row = rows.get(service.conn, server_id)
        if row is None or row.state != rows.STARTING or plan_rows.plan_of_server(service.conn, server_id) is None \
                or service.supervision.get(server_id) is not None:
            return
        holder = Identity(row.user, row.uid, False)
        ServerService(service.conn, holder, service.config, clock=service.clock,
                      processes=service.supervision).failed(server_id, reason, [])
        service.hub.changed("servers")

    server.database.submit(record).result()


def start_due(server: Agent) -> list[int]:
    """One pass: start the occurrences due now through the registered runner; returns the servers started.
    Without a runner nothing is recorded, so they start when one registers (while their booking lasts)."""
    from app.llama.rows import server_to_wire  # start-up: llama's modules load only for servers
    from app.llama.service import ServerService  # start-up: llama's modules load only for servers

    service = server.service
    runner = getattr(service, "runner", None)
    if runner is None or runner.gone:
        return []
    started = []
    now = int(service.clock())
    for plan, booking_id in plan_rows.due(service.conn, now):
        if (booking := booking_rows.get(service.conn, booking_id)) is not None and not here(service, booking):
            continue  # another host's cards: its service starts it, through its runner
        holder = Identity(plan.user, plan.uid, False)
        topology = service.fleet.latest().topology if service.fleet is not None else None
        rules = ServerService(service.conn, holder, service.config, topology=topology, clock=service.clock,
                              processes=service.supervision)
        try:
            row = rules.prepare(booking_id, **{k: v for k, v in plan.spec.items() if k in SPEC_KEYS})
        except BoardError as error:
            with write(service.conn):
                plan_rows.record_run(service.conn, plan.id, booking_id, now, error=str(error)[:200])
            log.warning(f"planned server {plan.id} for booking {booking_id}: not started: {error}")
            audit(service, AGENT, "server-plan-start", booking_id, ok=False,
                  details={"plan": plan.id, "refused": str(error)[:200]})
            continue
        with write(service.conn):
            plan_rows.record_run(service.conn, plan.id, booking_id, now, server_id=row.id)
        grant = {"ready_timeout_s": service.config.llama.ready_timeout_s, "db": None,
                 "model_dirs": list(service.config.llama.model_dirs)}
        if not runner.send({"event": "start", "server": server_to_wire(row), "launch": grant}):
            log.warning(f"planned server {plan.id}: the runner went away before server {row.id} could start")
        else:
            log.info(f"planned server {plan.id}: server {row.id} for booking {booking_id} ({plan.user}) sent to"
                     f" the runner")
        started.append(row.id)
        service.hub.changed("servers")
    return started

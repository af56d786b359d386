"""The llama-server rules bound to the service, and, behind the socket, the supervision of registered servers.
The operations (serve_start, serve_get, serve_list, serve_logs, serve_stop) are app.service.ops.servers.

The shape, one set of rules for both transports:

    board serve start ──serve_start──▶ Service ──▶ ServerService.prepare (app.llama.service):
      (the member)                                 holder, active booking, model, port lease, extra args;
          │                                        the row, state `starting`, audited
          └─ spawns the supervisor as itself (app.llama.launch)
                   │
                   ├─ socket: `register` kind "server" ──▶ the door's register ──▶ `serve_registration`
                   │    pid/uid from SO_PEERCRED, a pidfd (Registry.add); the connection stays open and carries
                   │    the supervisor's reports (ready, with the memory llama.cpp logged; failed; log lines;
                   │    exit), which call the same ServerService.ready/failed/ended as file mode
                   └─ file mode: the supervisor calls those methods itself on the user's own database

`serve_stop` and the booking end (`enforce_servers`, from ServiceServer.enforce_once) go through
ServerService.stop; behind the socket its `processes` is this module's `Supervision`, which signals
only through registered pidfds (SIGTERM, SIGKILL after KILL_AFTER_S). The service never opens a path
from a row: log lines reach it because the supervisor sends them. Every change of a server row
announces itself with `hub.changed("servers")`; boards then ask `serve_list`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeGuard

from app import wire
from app.core.identity import Identity
from app.errors import BadInput, BoardError, NotPermitted
from app.service.rules.audit import AGENT, audit
from app.service.box.processes import RegistrationError, exited, owned_by, proc_pgid
from app.service.rules.plans import runner_uid
from app.store import bookings as booking_rows
from app.store.plans import plan_of_server

if TYPE_CHECKING:
    import socket

    from app.llama.rows import Server
    from app.llama.service import ServerService
    from app.service import Service
    from app.service.conn.agent import Agent
    from app.service.conn.deadline import Lines
    from app.service.conn.peer import Peer
    from app.service.box.processes import Registration, Registry

LOG_KEEP = 500  # lines of each server's log the service keeps in memory
LINE_MAX = 1000
KILL_AFTER_S = 10.0

log = logging.getLogger(__name__)


# -- the rules, bound to the service ------------------------------------------------------------


def server_rules(service: Service, me: Identity) -> ServerService:
    """ServerService for `me` on the service's connection: file mode in process, the pidfds behind the socket."""
    from app.llama.service import ServerService  # start-up: llama's modules load only for servers

    processes = service.supervision if service.transport == "socket" else None
    topology = service.fleet.latest().topology if service.fleet is not None else None
    return ServerService(service.conn, me, service.config, topology=topology, clock=service.clock,
                         processes=processes)


def light_rules(service: Service, me: Identity) -> ServerService:
    from app.llama.service import ServerService  # start-up: llama's modules load only for servers

    processes = service.supervision if service.transport == "socket" else None
    return ServerService(service.conn, me, service.config, clock=service.clock, processes=processes)


def changed(service: Service) -> None:
    """Every change of a server row says so: boards then ask `serve_list`."""
    service.hub.changed("servers")


# -- supervision behind the socket --------------------------------------------------------------


@dataclass
class Supervised:
    server_id: int
    entry: Registration
    lines: deque = field(default_factory=lambda: deque(maxlen=LOG_KEEP))
    exit: dict | None = None  # the supervisor's last `exit` report
    term_sent_at: float | None = None
    killed: bool = False
    finished: bool = False  # finish() has recorded the end


class Supervision:
    """Registered servers: server id -> the supervisor's pidfd registration. ServerService's `processes`."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self.servers: dict[int, Supervised] = {}

    def add(self, server_id: int, entry: Registration) -> Supervised:
        with self._lock:
            current = self.servers.get(server_id)
            if current is not None and not current.entry.done:
                raise NotPermitted(f"server {server_id} already has a supervisor")
            supervised = self.servers[server_id] = Supervised(server_id, entry)
            return supervised

    def get(self, server_id: int) -> Supervised | None:
        with self._lock:
            return self.servers.get(server_id)

    def alive(self, server: Server) -> bool | None:
        """Registered and not yet finished: finish() records the end as soon as the supervisor's connection
        closes and its pidfd says it exited (or at the next enforcement pass), with what it reported."""
        found = self.get(server.id)
        if found is None:
            return None
        return not found.finished

    def terminate(self, server: Server) -> list[int]:
        found = self.get(server.id)
        if found is None or found.entry.done:
            return []
        if found.term_sent_at is None:
            found.term_sent_at = time.monotonic()
        return self.registry.signal(found.entry, signal.SIGTERM)

    def lines(self, server: Server) -> list[str]:
        found = self.get(server.id)
        return list(found.lines) if found else []

    def forget(self, server_id: int) -> None:
        with self._lock:
            self.servers.pop(server_id, None)


def serve_registration(server: Agent, conn: socket.socket, reader: Lines, peer: Peer, request_id: Any,
                       args: dict) -> None:
    """A supervisor registers (the door's `register`, kind "server") and reports over this connection.

    Refused unless the peer (SO_PEERCRED) is the row's holder, the row is `starting`, the booking is
    active and no live supervisor holds the row already. A pid the supervisor claims for llama-server
    is recorded only when the kernel shows it in the supervisor's group, under the same uid.

    `resume`: a supervisor registering again after the service restarted. Taken only when the peer is the
    very process the row recorded as its supervisor (pid, start time and command line, under the same
    uid) and the row is still live; it takes over the registration adopt_servers made at start-up.
    """
    from app.llama import rows  # start-up: llama's modules load only for servers
    from app.llama.identity import capture  # start-up: llama's modules load only for servers
    from app.service.conn.peer import identity_of  # start-up: in process, nobody asks the kernel who is calling

    service = server.service
    me = identity_of(peer, service.config.admin_group)
    server_id, child_pid, log_path = args.get("server"), args.get("pid"), args.get("log")
    api_key, resume = args.get("api_key"), args.get("resume", False)
    if not _is_int(server_id) or (child_pid is not None and not _is_int(child_pid)) or (
            log_path is not None and not isinstance(log_path, str)) or not isinstance(resume, bool) or (
            api_key is not None and rows.check_api_key(api_key) is None):
        server.reply(conn, request_id, error=BadInput("register: give kind \"server\", the server id, its pid"))
        return

    def admit() -> tuple[Supervised, float]:
        rules = light_rules(service, me)
        row = rules.get(server_id)
        booking = booking_rows.get(service.conn, row.booking_id)
        try:
            supervised = (_resumed if resume else _admitted)(server, row, booking, peer)
        except NotPermitted as refusal:
            audit(service, me, "server-register", row.booking_id, ok=False,
                  details={"server": server_id, "pid": peer.pid, "refused": str(refusal)})
            raise
        assert booking is not None  # _admitted and _resumed refuse a row without one
        if resume:
            log.info(f"server {server_id} ({row.user}, port {row.port}): its supervisor registered again")
            return supervised, booking.end
        entry = supervised.entry
        child = None
        if child_pid is not None and child_pid > 1 and proc_pgid(child_pid) == entry.pgid \
                and owned_by(child_pid, peer.uid):
            child = capture(child_pid)
        rules.supervised(server_id, supervisor=capture(peer.pid), pgid=entry.pgid, child=child,
                         log_path=(log_path or "")[:500], api_key=api_key)
        changed(service)
        return supervised, booking.end

    try:
        supervised, booking_end = server.database.submit(admit).result()
    except BoardError as error:
        server.reply(conn, request_id, error=error)
        return
    except Exception as error:  # noqa: BLE001 - logged; the supervisor hears a refusal and stops its server
        log.error(f"register server {server_id}: unexpected {type(error).__name__}: {error}")
        server.reply(conn, request_id, error=BoardError(f"the service failed to register server {server_id}"))
        return
    server.reply(conn, request_id, {"registration": supervised.entry.id, "server": server_id,
                                     "booking_end": booking_end})

    def report(message: dict) -> None:
        rules = light_rules(service, me)
        event = message.get("event")
        if event == "ready":
            from app.llama.service import measured_figures  # start-up: llama's modules load only for servers

            memory = message.get("memory")
            figures = measured_figures(memory)
            if memory is not None and figures is None:  # the member's own process sent it: ignored, not fatal
                log.warning(f"server {server_id}: ignored a memory report that is not llama.cpp's figures")
            if rules.ready(server_id, measured=figures):
                changed(service)
        elif event == "failed":
            rules.failed(server_id, str(message.get("reason") or "failed")[:200], _lines(message.get("tail")))
            changed(service)
        elif event == "exit":
            supervised.exit = message

    try:
        while True:
            line = reader.readline(None)  # a supervisor may be quiet for hours; a line it begins has a deadline
            if not line or len(line) > wire.MAX_MESSAGE:
                break
            try:
                message = wire.decode(line)
            except ValueError:
                break
            if not isinstance(message, dict):
                break
            if message.get("event") == "log":
                supervised.lines.extend(_lines(message.get("lines"), LOG_KEEP))
                continue
            server.database.submit(report, message).result()
    except OSError:
        pass
    server.service.processes.disconnected(supervised.entry)

    # A closed connection: once the pidfd says the supervisor has exited, the row records how it ended.
    # (Checked on the database thread, where the enforcement's sweep may close the pidfd.) A supervisor
    # that only closed the socket is finished by a later enforcement pass, when it exits.
    def ended() -> bool:
        if supervised.finished:
            return True
        if supervised.entry.done or exited(supervised.entry.pidfd):
            finish(service, supervised)
            return True
        return False

    deadline = time.monotonic() + 3.0
    while not server.database.submit(ended).result() and time.monotonic() < deadline:
        time.sleep(0.02)


def _admitted(server: Agent, row: Server, booking, peer: Peer) -> Supervised:
    """A new supervisor for a `starting` row of the peer's, on its active booking."""
    from app.llama import rows  # start-up: llama's modules load only for servers

    if not may_supervise(server.service, row, peer.uid):
        raise NotPermitted(f"server {row.id} belongs to {row.user}")
    if row.state != rows.STARTING:
        raise NotPermitted(f"server {row.id} is {row.state}, not starting")
    if booking is None or booking.uid != row.uid or not booking.active(server.service.clock()):
        raise NotPermitted(f"booking {row.booking_id} is not yours and active now")
    try:
        entry = server.service.processes.add("server", row.booking_id, peer.uid, peer.pid)
    except RegistrationError as error:
        raise NotPermitted(str(error)) from None
    return _watch(server, row.id, entry)


def _resumed(server: Agent, row: Server, booking, peer: Peer) -> Supervised:
    """The supervisor the row recorded, registering again: the same process (pid, start time, command line),
    the same uid, its row still live. A gap that spanned the booking's end is the enforcement's to act on."""
    from app.llama.identity import ProcessIdentity, check  # start-up: llama's modules load only for servers

    recorded = ProcessIdentity(row.supervisor_pid or 0, row.supervisor_started, row.supervisor_cmdline)
    if not row.live or booking is None:
        raise NotPermitted(f"server {row.id} is {row.state}")
    if row.supervisor_pid != peer.pid or not may_supervise(server.service, row, peer.uid) \
            or not owned_by(peer.pid, peer.uid) or check(recorded) != "match":
        raise NotPermitted(f"server {row.id}: you are not the supervisor it recorded")
    watch = server.service.supervision
    current = watch.get(row.id)
    if current is not None and not current.entry.done and current.entry.pid == peer.pid:
        current.entry.connected = True  # the registration adopt_servers made at start-up
        return current
    try:
        entry = server.service.processes.add("server", row.booking_id, peer.uid, peer.pid, pgid=row.pgid)
    except RegistrationError as error:
        raise NotPermitted(str(error)) from None
    return _watch(server, row.id, entry)


def _watch(server: Agent, server_id: int, entry: Registration) -> Supervised:
    try:
        return server.service.supervision.add(server_id, entry)
    except NotPermitted:
        os.close(entry.pidfd)
        server.service.processes.entries.pop(entry.id, None)
        raise


def may_supervise(service: Service, row: Server, uid: int) -> bool:
    """The holder's own processes supervise their servers; the runner (app.service.rules.plans) those a plan started."""
    if uid == row.uid:
        return True
    return uid == runner_uid(service) and plan_of_server(service.conn, row.id) is not None


def adopt_servers(server: Agent) -> list[int]:
    """After a restart: take back the live servers whose recorded supervisor (pid, start time, command line)
    still runs, under a uid that may supervise it; their supervisors register again (`resume`) on their own.
    The rest are left to reconcile, which records them as gone. Returns the server ids adopted."""
    from app.llama import rows  # start-up: llama's modules load only for servers
    from app.llama.identity import ProcessIdentity, check  # start-up: llama's modules load only for servers

    service = server.service
    adopted = []
    for row in rows.live(service.conn, service.host):
        if row.supervisor_pid is None or row.supervisor_pid <= 1:
            continue
        recorded = ProcessIdentity(row.supervisor_pid, row.supervisor_started, row.supervisor_cmdline)
        try:
            uid = os.stat(f"/proc/{row.supervisor_pid}").st_uid
        except OSError:
            continue
        if not may_supervise(service, row, uid):
            continue
        try:
            entry = server.service.processes.add("server", row.booking_id, uid, row.supervisor_pid, pgid=row.pgid)
        except RegistrationError:
            continue
        if check(recorded) != "match":  # checked again now that the pidfd pins the process
            os.close(entry.pidfd)
            server.service.processes.entries.pop(entry.id, None)
            continue
        server.service.processes.disconnected(entry)
        try:
            _watch(server, row.id, entry)
        except NotPermitted:
            continue
        adopted.append(row.id)
    if adopted:
        log.info(f"board agent: took back {len(adopted)} running server(s): {', '.join(map(str, adopted))}")
    return adopted


def finish(service: Service, supervised: Supervised) -> None:
    """The supervisor has exited: the row records the end it reported (or 'exit status unknown')."""
    from app.llama import rows  # start-up: llama's modules load only for servers

    if supervised.finished:
        return
    supervised.finished = True
    report = supervised.exit or {}
    row = rows.get(service.conn, supervised.server_id)
    if row is None:
        return
    holder = Identity(row.user, row.uid, False)
    rules = light_rules(service, holder)
    if row.live:
        code, sig = report.get("code"), report.get("signal")
        rules.ended(supervised.server_id, exit_code=code if _is_int(code) else None,
                    exit_signal=sig if _is_int(sig) else None, text=_text(report.get("text")),
                    tail=_lines(report.get("tail")) or list(supervised.lines)[-20:],
                    asked=bool(report.get("asked")) or supervised.term_sent_at is not None,
                    unexpected=None if report else "the supervisor is gone; exit status unknown")
        changed(service)


def enforce_servers(server: Agent) -> dict[str, list[int]]:
    """One pass (ServiceServer.enforce_once): ended supervisors finish their rows, servers whose booking
    ended are stopped (audited, as the agent), SIGKILL follows SIGTERM after KILL_AFTER_S, and rows
    that never registered within the launch grace become crashed."""
    from app.llama import rows  # start-up: llama's modules load only for servers

    service = server.service
    watch = service.supervision
    done: dict[str, list[int]] = {"servers_finished": [], "servers_stopped": [], "servers_killed": []}
    for supervised in list(watch.servers.values()):
        if supervised.entry.done:
            if not supervised.finished:
                finish(service, supervised)
                done["servers_finished"].append(supervised.server_id)
            watch.forget(supervised.server_id)
    rules = light_rules(service, AGENT)
    if rules.reconcile():
        changed(service)
    for row in rows.ended_bookings(service.conn, int(service.clock()), service.host):
        stopped = rules.stop(row.id, reason=f"booking {row.booking_id} ended", enforce=True)
        log.info(f"server {row.id} ({row.user}, port {row.port}): booking {row.booking_id} ended; {stopped.state}")
        done["servers_stopped"].append(row.id)
        changed(service)
    now = time.monotonic()
    for supervised in list(watch.servers.values()):
        if supervised.entry.done:
            continue
        if supervised.term_sent_at is None:
            booking = booking_rows.get(service.conn, supervised.entry.booking_id)
            if booking is None or not booking.active(service.clock()):  # its row was final, its process not
                supervised.term_sent_at = now
                server.service.processes.signal(supervised.entry, signal.SIGTERM)
        elif not supervised.killed and now - supervised.term_sent_at >= KILL_AFTER_S:
            supervised.killed = True
            sent = server.service.processes.signal(supervised.entry, signal.SIGKILL)
            if sent:
                audit(service, AGENT, "server-stop", supervised.entry.booking_id, ok=True,
                      details={"server": supervised.server_id, "signal": "SIGKILL", "pids": sent})
                done["servers_killed"].append(supervised.server_id)
    return done


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) < value < 2**63


def _text(value) -> str | None:
    return str(value)[:200] if value is not None else None


def _lines(value, keep: int = 20) -> list[str]:
    if not isinstance(value, list):
        return []
    return [str(line)[:LINE_MAX] for line in value[-keep:]]

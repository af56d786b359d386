"""llama-server rules: who may start and stop, port leases, how a server's life is recorded, booking end.

One set of rules for both transports. The `serve_*` operations (app.service.box.servers) call these
methods on the service's connection; what differs is only how a process is reached:

- **file mode** (`processes=None`: one user's own database, in process): the row's process
  identities (pid + start time + command line, app.llama.identity) are the user's own records of
  the user's own processes; stop signals the verified process group and waits, the log file beside
  the database is read, and the supervisor records its own reports by calling `supervised`,
  `ready`, `failed` and `ended` on its own connection.
- **socket mode** (`processes` = the service's `Supervision`, app.service.box.servers): nothing in a
  row is trusted. A server is alive while its registered supervisor's pidfd says so; stop sends
  SIGTERM through that pidfd (the service SIGKILLs after KILL_AFTER_S) and returns at once; the
  same `ready`/`failed`/`ended` are called by the service for the messages the supervisor sends.

Nothing here spawns a process: the caller launches the server it was granted (app.llama.launch),
as itself. Every start, stop and refusal is audited in the events table inside the same short
write transaction as the change. How a server is supervised is explained in app.llama.supervisor.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from app.config import Config
from app.errors import BadInput, BoardError, Conflict, NotPermitted
from app.core.identity import Identity
from app.core.request import readable
from app.core.text import relative, stamp_time
from app.gpu.model import Topology
from app.llama import command as cmd
from app.llama import aliases, logs, ports, rows
from app.llama.binary import find_server_bin
from app.llama.identity import ProcessIdentity, check, group_members, signal_group
from app.faults.oom import record_server_build, record_server_oom
from app.llama.rows import Server
from app.model import Booking
from app.store import bookings as booking_rows
from app.store import events
from app.store import plans as plan_rows
from app.store.db import write

KILL_AFTER_S = 10.0
SUPERVISOR_GRACE_S = 3.0  # time for the supervisor to SIGKILL and record the exit itself
# A row whose supervisor has not been recorded (registered) yet is still being launched for this long.
LAUNCH_GRACE_S = 30.0
WARN_BEFORE_END_S = 600


class Processes(Protocol):
    """How the socket service reaches servers: only through what the kernel told it (app.service.box.servers)."""

    def alive(self, server: Server) -> bool | None:
        """True while its registered supervisor runs, False once it has gone, None if it never registered."""

    def terminate(self, server: Server) -> list[int]:
        """SIGTERM through the supervisor's pidfd and to its group's members the holder owns; SIGKILL follows."""

    def lines(self, server: Server) -> list[str]:
        """The last log lines its supervisor sent."""


class ServerService:
    """The rules, bound to one connection, one caller and (for card order) one topology."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        me: Identity,
        config: Config,
        *,
        topology: Topology | None = None,
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str] = os.environ,
        processes: Processes | None = None,
    ):
        self.conn, self.me, self.config, self.topology = conn, me, config, topology
        self.clock, self.environ, self.processes = clock, environ, processes

    @property
    def own_files(self) -> bool:
        """File mode: the rows and log files are the caller's own (see the module docstring)."""
        return self.processes is None


    # -- queries -------------------------------------------------------------------------------

    def get(self, server_id: int) -> Server:
        server = rows.get(self.conn, server_id)
        if server is None:
            raise BadInput(f"no server {server_id}; 'board serve list' shows the servers")
        return server

    def listing(self, *, everything: bool = False, user: str | None = None, limit: int | None = None) -> list[Server]:
        """Live servers, or (everything) the recent ones too. Reconciles first, so dead ones show as crashed."""
        try:
            self.reconcile()
        except (BoardError, sqlite3.Error):
            pass  # a read-only or busy database: list what it says
        return rows.listing(self.conn, live_only=not everything, user=user, limit=limit)

    # -- start ---------------------------------------------------------------------------------

    def prepare(
        self,
        booking_id: int,
        *,
        model: str | None = None,
        ctx: int | None = None,
        parallel: int | None = None,
        port: int | None = None,
        split_mode: str = "layer",
        tensor_split: str | None = None,
        metrics: bool = False,
        alias: str | None = None,
        host: str | None = None,
        extra: Sequence[str] = (),
        cache_type_k: str | None = None,
        cache_type_v: str | None = None,
        flash_attn: str | None = None,
        fit: dict | None = None,
    ) -> Server:
        """Check everything and lease a port: the row, in state `starting`, that the caller then launches
        (app.llama.launch). Nothing is spawned here: behind the socket the service must not run a member's
        server, so in file mode the caller's own process launches it the same way."""
        settings = self.config.llama
        binary = find_server_bin(settings, self.environ)
        booking = self._booking(booking_id)
        request = readable(booking.request)  # a row stored before requests were checked may hold anything
        details = {"model": model, "port": port}
        self._audited_check("server-start", booking_id, details, lambda: self._may_start(booking, int(self.clock())))

        model = model or request.get("model")
        if not model:
            raise BadInput("say which model: --model PATH.gguf")
        model_path = cmd.model_argument(model)
        ctx = _positive("--ctx", ctx if ctx is not None else request.get("ctx") or cmd.DEFAULT_CTX)
        parallel = _positive("--parallel", parallel if parallel is not None else request.get("parallel")
                             or cmd.DEFAULT_PARALLEL)
        cache_type_k = cmd.cache_type("k", cache_type_k or request.get("cache_type_k") or "f16")
        cache_type_v = cmd.cache_type("v", cache_type_v or request.get("cache_type_v") or "f16")
        if flash_attn is None:
            flash_attn = "off" if request.get("flash_attn") is False else "on"
        if flash_attn not in ("on", "off"):
            raise BadInput(f"--flash-attn is on or off, not {flash_attn[:20]!r}")
        if split_mode not in cmd.SPLIT_MODES:
            raise BadInput(f"unknown split mode {split_mode!r}; use {' or '.join(cmd.SPLIT_MODES)}")
        extra = cmd.check_extra(extra, settings.model_dirs)
        estimate = checked_estimate(fit, len(booking.cards))
        host = host or settings.host
        if host not in settings.allowed_hosts:
            refusal = NotPermitted(f"host {host} is not allowed; the config allows {', '.join(settings.allowed_hosts)}")
            self._refused("server-start", booking_id, {**details, "host": host}, refusal)
        if port is not None and not settings.port_min <= port <= settings.port_max:
            raise BadInput(f"port {port} is outside the server range {settings.port_min}-{settings.port_max}")
        cards = cmd.topology_order(booking.cards, self.topology)
        if tensor_split is None and len(cards) > 1:  # explicit, so the split board estimated is the one that happens
            tensor_split = ",".join(["1"] * len(cards))
        uuid_of = dict(zip(booking.cards, booking.card_uuids))
        uuids = [uuid_of[c] for c in cards]
        defaulted = not alias
        alias = alias or Path(model_path).stem

        self.reconcile()  # dead servers give their ports back (and their aliases)
        self._audited_check("server-start", booking_id, {**details, "alias": alias},
                            lambda: self._may_hold(booking, alias, int(self.clock()), defaulted))
        server_id, port = self._lease(booking_id, port, host, lambda p: dict(
            booking_id=booking_id, user=self.me.name, uid=self.me.uid, cards=cards, card_uuids=uuids,
            model=model_path, alias=alias, host=host, port=p, ctx=ctx, parallel=parallel, split_mode=split_mode,
            fleet_host=self.config.fleet_host,
            metrics=metrics, estimate=estimate, cmdline=cmd.server_argv(binary, model=model_path, host=host, port=p, ctx=ctx,
                                                     parallel=parallel, split_mode=split_mode,
                                                     tensor_split=tensor_split, metrics=metrics, alias=alias,
                                                     cache_types=(cache_type_k, cache_type_v), flash_attn=flash_attn,
                                                     extra=extra)), audit={"fit": estimate} if estimate else {})
        return self.get(server_id)

    def _booking(self, booking_id: int) -> Booking:
        booking = booking_rows.get(self.conn, booking_id)
        if booking is None:
            raise BadInput(f"no booking {booking_id}; 'board list --mine' shows your bookings")
        return booking

    def _may_start(self, booking: Booking, now: int) -> None:
        if booking.uid != self.me.uid:
            raise NotPermitted(f"booking {booking.id} belongs to {booking.user}; only its holder can start a server on it")
        if booking.status != "booked":
            raise NotPermitted(f"booking {booking.id} is cancelled")
        if not booking.active(now):
            when = (f"ended {stamp_time(booking.end, now)}, {relative(booking.end, now)}" if booking.end <= now
                    else f"starts {stamp_time(booking.start, now)}, {relative(booking.start, now)}")
            raise NotPermitted(f"booking {booking.id} is not active now ({when}); servers run only inside a booking")

    def _may_hold(self, booking: Booking, alias: str, now: int, defaulted: bool) -> None:
        """The alias is free of other members' servers and plans until the booking ends (app.llama.aliases)."""
        aliases.check(self.conn, self.config, user=self.me.name, uid=self.me.uid, alias=alias,
                      spans=[(now, booking.end)], now=now, defaulted=defaulted,
                      plan=plan_rows.own_plan(self.conn, booking.id, self.me.uid, alias))

    def _lease(self, booking_id: int, wanted: int | None, host: str, fields: Callable[[int], dict],
               audit: dict) -> tuple[int, int]:
        """Insert the row with the first port that is neither leased to a live server nor bound by anyone."""
        settings = self.config.llama
        leased = rows.used_ports(self.conn)
        candidates = ports.candidates(settings.port_min, settings.port_max, leased, wanted)
        details = {"port": wanted}
        if wanted is not None and not candidates:
            self._refused("server-start", booking_id, details, Conflict(f"port {wanted} is leased to another server"))
        for port in candidates:
            if not ports.bind_free(host, port):
                if wanted is not None:
                    self._refused("server-start", booking_id, details,
                                  Conflict(f"port {port} is in use by another program"))
                continue
            now = int(self.clock())
            values = fields(port)
            try:
                with write(self.conn):
                    booking = self._booking(booking_id)
                    self._may_start(booking, now)  # again, under the write lock
                    self._may_hold(booking, values["alias"], now, False)
                    server_id = rows.insert(self.conn, now=now, **values)
                    if self.own_files:  # the user's own database: the log goes beside it
                        rows.set_log_path(self.conn, server_id, str(logs.log_dir(self.config) / f"{server_id}.log"))
                    events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action="server-start",
                                  booking_id=booking_id, ok=True,
                                  details={"server": server_id, "port": port, "model": values["model"],
                                           "cards": values["cards"], **audit})
                return server_id, port
            except (NotPermitted, Conflict) as refusal:
                self._refused("server-start", booking_id, details, refusal)
            except sqlite3.IntegrityError:
                continue  # another board leased this port a moment ago
        self._refused("server-start", booking_id, details, Conflict(
            f"no free port in {settings.port_min}-{settings.port_max}; stop a server or widen llama.port_min/port_max"))
        raise AssertionError("unreachable")

    # -- what the supervisor reports (file mode: it calls these itself; socket: the service, for it) ---

    def supervised(self, server_id: int, *, supervisor: ProcessIdentity | None = None, pgid: int | None = None,
                   child: ProcessIdentity | None = None, log_path: str | None = None,
                   api_key: str | None = None) -> None:
        """Record who runs the server: its supervisor (and its group), llama-server itself, its log, its API key."""
        with write(self.conn):
            if api_key is not None:
                rows.set_api_key(self.conn, server_id, api_key)
            if supervisor is not None:
                rows.set_supervisor(self.conn, server_id, supervisor.pid, supervisor.started, supervisor.cmdline,
                                    pgid=pgid if pgid is not None else supervisor.pid)
            if child is not None:
                rows.set_process(self.conn, server_id, child.pid, child.started, child.cmdline)
            if log_path is not None:
                rows.set_log_path(self.conn, server_id, log_path)

    def ready(self, server_id: int, *, measured: object = None) -> bool:
        """`starting` -> `ready`, recording the memory llama.cpp logged at load (`measured`, Measured.to_json's
        shape) when it came with the report. The supervisor is the holder's own process: figures of another
        shape are ignored (rows.check_measured), never an error, so a ready server is never lost over them."""
        figures = measured_figures(measured)
        with write(self.conn):
            moved = rows.transition(self.conn, server_id, [rows.STARTING], rows.READY, ready_at=int(self.clock()))
            if moved and figures is not None:
                rows.set_measured(self.conn, server_id, figures)
        return moved

    def failed(self, server_id: int, reason: str, tail: Sequence[str]) -> bool:
        """Not ready in time: `failed` (its supervisor stops it)."""
        now = int(self.clock())
        with write(self.conn):
            server = rows.get(self.conn, server_id)
            moved = rows.transition(self.conn, server_id, [rows.STARTING], rows.FAILED, reason=reason,
                                    log_tail=list(tail), ended_at=now)
            if moved and server is not None:
                events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action="server-fail",
                              booking_id=server.booking_id, ok=True,
                              details={"server": server_id, "by": "supervisor", "reason": reason})
                for record in (record_server_oom, record_server_build):
                    record(self.conn, ts=now, booking_id=server.booking_id, user=server.user,
                           server_id=server_id, card_uuids=server.card_uuids, tail=tail)
        return moved

    def ended(self, server_id: int, *, exit_code: int | None = None, exit_signal: int | None = None,
              text: str | None = None, tail: Sequence[str] = (), asked: bool = False,
              unexpected: str | None = None) -> Server | None:
        """llama-server (or its supervisor) is gone: `stopped` when someone asked, else `crashed` (audited)."""
        if unexpected is None:
            known = exit_code is not None or exit_signal is not None
            unexpected = "exited unexpectedly" if known else (text or "exit status unknown")
        ended_at = int(self.clock())
        info = dict(exit_code=exit_code, exit_signal=exit_signal, ended_at=ended_at)
        with write(self.conn):
            current = rows.get(self.conn, server_id)
            if current is None:
                return None
            if current.state == rows.STOPPING or (asked and current.state in rows.LIVE_STATES):
                rows.transition(self.conn, server_id, rows.LIVE_STATES, rows.STOPPED, **info)
            elif current.state in (rows.STARTING, rows.READY):
                if rows.transition(self.conn, server_id, [current.state], rows.CRASHED, reason=unexpected,
                                   log_tail=list(tail), **info):
                    events.record(self.conn, ts=ended_at, uid=self.me.uid, actor=self.me.name,
                                  action="server-crash", booking_id=current.booking_id, ok=True,
                                  details={"server": server_id, "exit": text or "unknown", "found_by": self.me.name})
                    for record in (record_server_oom, record_server_build):
                        record(self.conn, ts=ended_at, booking_id=current.booking_id, user=current.user,
                               server_id=server_id, card_uuids=current.card_uuids, tail=tail)
            elif current.exit_code is None and current.exit_signal is None and (exit_code, exit_signal) != (None, None):
                rows.update(self.conn, server_id, exit_code=exit_code, exit_signal=exit_signal,
                            ended_at=current.ended_at or ended_at)
        return rows.get(self.conn, server_id)

    def api_key(self, server_id: int) -> str:
        """The server's own API key: its holder's and admins' to read (refusals audited)."""
        server = self.get(server_id)
        self.holder_or_admin(server, "server-key", "read its key")
        if not server.api_key:
            raise BadInput(f"server {server_id} has no API key ({server.state}; a key is made when it starts)")
        return server.api_key

    # -- stop ----------------------------------------------------------------------------------

    def stop(self, server_id: int, *, reason: str | None = None, enforce: bool = False, wait: bool = True) -> Server:
        """Stop a server: SIGTERM to its process group, SIGKILL after 10 s, until no process of it is left.

        Behind the socket it returns at once, `stopping` (the database thread must not wait): the caller
        watches the row (app.llama.launch.wait_final) while the supervisor and the service finish.

        `enforce`: a rule (the booking ended) rather than a person asks, so anyone's board may do it.
        Processes of another user cannot be signalled without root; then the row says `stopping` and
        the server's own supervisor stops it within a second.
        """
        server = self.get(server_id)
        if not enforce and server.uid != self.me.uid and not self.me.is_admin:
            self._refused("server-stop", server.booking_id, {"server": server_id}, NotPermitted(
                f"server {server_id} belongs to {server.user}; only they or an admin can stop it"))
        server = self._reconcile_one(server)
        if not server.live:
            return server
        reason = reason or f"stopped by {self.me.name}"
        now = int(self.clock())
        with write(self.conn):
            if rows.transition(self.conn, server.id, [rows.STARTING, rows.READY], rows.STOPPING, reason=reason):
                events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action="server-stop",
                              booking_id=server.booking_id, ok=True, details={"server": server.id, "reason": reason})
        server = self.get(server.id)
        if not server.live:
            return server
        if self.processes is not None:  # the service: SIGTERM through the pidfd; it SIGKILLs after KILL_AFTER_S
            self.processes.terminate(server)
            return server
        if server.pgid is None:  # launched a moment ago: its supervisor reads the row and stops it
            return self._wait_final(server, KILL_AFTER_S + 5) if wait else server
        mine = _identities(server)
        try:
            signalled = signal_group(server.pgid, signal.SIGTERM, mine)
        except PermissionError:  # another user's server: its supervisor has seen `stopping`
            return self._wait_final(server, KILL_AFTER_S + 5) if wait else server
        if not signalled:
            if any(check(i) == "hidden" for i in mine):
                return self._wait_final(server, KILL_AFTER_S + 5) if wait else server
            return self._reconcile_one(self.get(server.id))  # it went away on its own just now
        if wait:
            self._wait_group(server.pgid)
            self._finish_stop(server)
        return self.get(server.id)

    def _wait_group(self, pgid: int) -> None:
        """Wait until the server's group is empty; SIGKILL whatever is left a little after KILL_AFTER_S.

        The supervisor SIGKILLs llama-server itself at KILL_AFTER_S and records the exit status; the
        group SIGKILL here comes a moment later, for a supervisor that could not. It needs no second
        identity check: the group was verified as ours when it got SIGTERM and has had members at
        every poll since, so its number cannot have been reused.
        """
        deadline = time.monotonic() + KILL_AFTER_S + SUPERVISOR_GRACE_S
        killed = False
        delay = 0.005
        while group_members(pgid):
            if time.monotonic() >= deadline:
                if killed:
                    return  # unkillable (D state); the row still says stopping, and reconcile will finish it
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                killed, deadline = True, time.monotonic() + 5
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _wait_final(self, server: Server, timeout: float) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            current = self.get(server.id)
            if not current.live:
                return current
            time.sleep(0.05)
        return self.get(server.id)

    def _finish_stop(self, server: Server) -> None:
        """The supervisor records `stopped` with the exit status before it exits; if it was killed
        before it could, the group is empty and the row still live, and we record it."""
        if server.pgid is not None and group_members(server.pgid):
            return  # still there (unkillable for now); reconcile finishes it later
        with write(self.conn):
            rows.transition(self.conn, server.id, rows.LIVE_STATES, rows.STOPPED, ended_at=int(self.clock()))

    # -- reconcile and enforce -----------------------------------------------------------------

    def reconcile(self) -> list[Server]:
        """Mark live rows whose processes are gone: crashed (or stopped, if a stop was under way)."""
        changed = []
        for server in rows.live(self.conn, self.config.fleet_host):
            after = self._reconcile_one(server)
            if after.state != server.state:
                changed.append(after)
        return changed

    def _reconcile_one(self, server: Server) -> Server:
        if not server.live:
            return server
        now = int(self.clock())
        if self.processes is not None:
            alive = self.processes.alive(server)
            if alive or (alive is None and now - server.created_at < LAUNCH_GRACE_S):
                return server
        elif _alive(server) or (server.supervisor_pid is None and now - server.created_at < LAUNCH_GRACE_S):
            return server
        with write(self.conn):
            if server.state == rows.STOPPING:
                rows.transition(self.conn, server.id, [rows.STOPPING], rows.STOPPED, ended_at=now)
            else:
                reason = "the server and its supervisor are gone; exit status unknown"
                if rows.transition(self.conn, server.id, [server.state], rows.CRASHED, reason=reason, ended_at=now,
                                   log_tail=self._tail(server)):
                    events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action="server-crash",
                                  booking_id=server.booking_id, ok=True,
                                  details={"server": server.id, "exit": "unknown", "found_by": self.me.name})
        return self.get(server.id)

    def enforce_booking_end(self) -> list[Server]:
        """Stop every live server whose booking has ended or was cancelled."""
        stopped = []
        for server in rows.ended_bookings(self.conn, int(self.clock()), self.config.fleet_host):
            stopped.append(self.stop(server.id, reason=f"booking {server.booking_id} ended", enforce=True))
        return stopped

    def ending_soon(self, within_s: int = WARN_BEFORE_END_S) -> list[tuple[Server, int]]:
        """(server, seconds left) for live servers whose booking ends within `within_s`."""
        now = int(self.clock())
        found = []
        for server in rows.live(self.conn, self.config.fleet_host):
            booking = booking_rows.get(self.conn, server.booking_id)
            if booking and booking.status == "booked" and now < booking.end <= now + within_s:
                found.append((server, booking.end - now))
        return found

    # -- logs ----------------------------------------------------------------------------------

    def holder_or_admin(self, server: Server, action: str, what: str) -> None:
        """NotPermitted (audited as `action`) unless the caller holds the server or is an admin: its key, and its log,
        which may hold the prompts the gateway relayed to it (a `--verbose` server logs them)."""
        if server.uid != self.me.uid and not self.me.is_admin:
            self._refused(action, server.booking_id, {"server": server.id}, NotPermitted(
                f"server {server.id} belongs to {server.user}; only they or an admin can {what}"))

    def log_lines(self, server: Server, lines: int = logs.TAIL_LINES) -> list[str]:
        """The server's last log lines: from the user's own file in file mode; behind the socket, only what
        its supervisor sent (the service never opens a path from a row)."""
        if not server.live and server.log_tail and not self.own_files:
            return list(server.log_tail)[-lines:]
        if self.processes is None:  # own_files
            return logs.tail(server.log_path, lines, max_bytes=max(64 * 1024, lines * 512)) if server.log_path else []
        return self.processes.lines(server)[-lines:] if lines else []

    def _tail(self, server: Server) -> list[str]:
        return self.log_lines(server) if self.own_files or server.live else list(server.log_tail)

    # -- helpers -------------------------------------------------------------------------------

    def _mark(self, server: Server, state: str, reason: str) -> None:
        with write(self.conn):
            rows.transition(self.conn, server.id, rows.LIVE_STATES, state, reason=reason, ended_at=int(self.clock()))

    def _audited_check(self, action: str, booking_id: int, details: dict, check_: Callable[[], None]) -> None:
        try:
            check_()
        except (NotPermitted, Conflict) as refusal:
            self._refused(action, booking_id, details, refusal)

    def _refused(self, action: str, booking_id: int | None, details: dict, refusal: BoardError) -> None:
        with write(self.conn):
            events.record(self.conn, ts=int(self.clock()), uid=self.me.uid, actor=self.me.name, action=action,
                          booking_id=booking_id, ok=False, details={**details, "refused": str(refusal)})
        raise refusal



def _positive(flag: str, value) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise BadInput(f"{flag} must be a whole number, not {value!r}") from None
    if number < 1:
        raise BadInput(f"{flag} must be at least 1")
    return number


def measured_figures(value: object) -> dict | None:
    """A supervisor's memory report as stored (rows.check_measured), or None when there is none or it is junk."""
    if value is None:
        return None
    try:
        return rows.check_measured(value)
    except ValueError:
        return None


def checked_estimate(fit: object, cards: int) -> dict | None:
    """The client's estimate (app.fit.request.for_server) as stored, one figure per booked card; BadInput otherwise."""
    if fit is None:
        return None
    try:
        estimate = rows.check_estimate(fit)
    except ValueError as error:
        raise BadInput(f"serve_start: fit: {error}") from None
    if len(estimate["per_card_mib"]) != cards:
        raise BadInput(f"serve_start: fit: {len(estimate['per_card_mib'])} figures for {cards} booked cards")
    return estimate


def _identities(server: Server) -> list[ProcessIdentity]:
    found = []
    if server.pid is not None:
        found.append(ProcessIdentity(server.pid, server.pid_started, server.cmdline))
    if server.supervisor_pid is not None:
        found.append(ProcessIdentity(server.supervisor_pid, server.supervisor_started, server.supervisor_cmdline))
    return found


def _alive(server: Server) -> bool:
    """True when the server or its supervisor still runs (or cannot be inspected, so might)."""
    return any(check(i) in ("match", "hidden") for i in _identities(server))

"""llama-server lifecycle rules: start on a booking's cards, wait for ready, stop, reconcile, enforce booking ends.

Every start, stop and refusal is audited in the events table inside the same short write
transaction as the change. Processes are spawned, probed and signalled outside transactions.
How a server is supervised, and why, is explained in app.llama.supervisor.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from app.config import Config
from app.errors import BadInput, BoardError, Conflict, NotPermitted
from app.core.identity import Identity
from app.gpu.model import Topology
from app.llama import command as cmd
from app.llama import health, logs, ports, rows
from app.llama.binary import find_server_bin
from app.llama.identity import ProcessIdentity, capture, check, group_members, signal_group
from app.llama.rows import Server
from app.model import Booking
from app.store import bookings as booking_rows
from app.store import events
from app.store.db import write

SUPERVISOR = str(Path(__file__).resolve().with_name("supervisor.py"))
KILL_AFTER_S = 10.0
SUPERVISOR_GRACE_S = 3.0  # time for the supervisor to SIGKILL and record the exit itself
# A row whose supervisor has not been recorded yet is still being launched for this long.
LAUNCH_GRACE_S = 30.0
# The supervisor's own booking-end backstop, after the agent and board instances have had their turn.
BACKSTOP_S = 60.0
WARN_BEFORE_END_S = 600


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
    ):
        self.conn, self.me, self.config, self.topology = conn, me, config, topology
        self.clock, self.environ = clock, environ

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

    def start(
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
    ) -> Server:
        """Launch a server on the booking's cards; returns its row in state `starting`."""
        settings = self.config.llama
        binary = find_server_bin(settings, self.environ)
        booking = booking_rows.get(self.conn, booking_id)
        if booking is None:
            raise BadInput(f"no booking {booking_id}; 'board list --mine' shows your bookings")
        request = booking.request or {}
        details = {"model": model, "port": port}
        self._audited_check("server-start", booking_id, details, lambda: self._may_start(booking, int(self.clock())))

        model = model or request.get("model")
        if not model:
            raise BadInput("say which model: --model PATH.gguf")
        model_path = cmd.check_model(model)
        ctx = _positive("--ctx", ctx if ctx is not None else request.get("ctx") or cmd.DEFAULT_CTX)
        parallel = _positive("--parallel", parallel if parallel is not None else request.get("parallel")
                             or cmd.DEFAULT_PARALLEL)
        if split_mode not in cmd.SPLIT_MODES:
            raise BadInput(f"unknown split mode {split_mode!r}; use {' or '.join(cmd.SPLIT_MODES)}")
        extra = cmd.check_extra(extra)
        host = host or settings.host
        if host not in settings.allowed_hosts:
            refusal = NotPermitted(f"host {host} is not allowed; the config allows {', '.join(settings.allowed_hosts)}")
            self._refused("server-start", booking_id, {**details, "host": host}, refusal)
        if port is not None and not settings.port_min <= port <= settings.port_max:
            raise BadInput(f"port {port} is outside the server range {settings.port_min}-{settings.port_max}")
        cards = cmd.topology_order(booking.cards, self.topology)
        uuid_of = dict(zip(booking.cards, booking.card_uuids))
        uuids = [uuid_of[c] for c in cards]
        alias = alias or Path(model_path).stem

        self.reconcile()  # dead servers give their ports back
        server_id, port = self._lease(booking_id, port, host, lambda p: dict(
            booking_id=booking_id, user=self.me.name, uid=self.me.uid, cards=cards, card_uuids=uuids,
            model=model_path, alias=alias, host=host, port=p, ctx=ctx, parallel=parallel, split_mode=split_mode,
            metrics=metrics, cmdline=cmd.server_argv(binary, model=model_path, host=host, port=p, ctx=ctx,
                                                     parallel=parallel, split_mode=split_mode,
                                                     tensor_split=tensor_split, metrics=metrics, alias=alias,
                                                     extra=extra)))
        server = self.get(server_id)
        try:
            self._launch(server)
        except BoardError as error:
            self._mark(server, rows.CRASHED, reason=str(error))
            raise
        return self.get(server_id)

    def _may_start(self, booking: Booking, now: int) -> None:
        if booking.uid != self.me.uid:
            raise NotPermitted(f"booking {booking.id} belongs to {booking.user}; only its holder can start a server on it")
        if booking.status != "booked":
            raise NotPermitted(f"booking {booking.id} is cancelled")
        if not booking.active(now):
            from app.core.text import format_time

            when = "ended" if booking.end <= now else f"starts {format_time(booking.start, now)}"
            raise NotPermitted(f"booking {booking.id} is not active now ({when}); servers run only inside a booking")

    def _lease(self, booking_id: int, wanted: int | None, host: str, fields: Callable[[int], dict]) -> tuple[int, int]:
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
                    booking = booking_rows.get(self.conn, booking_id)
                    self._may_start(booking, now)  # again, under the write lock
                    server_id = rows.insert(self.conn, now=now, **values)
                    rows.set_log_path(self.conn, server_id, str(logs.log_dir(self.config) / f"{server_id}.log"))
                    events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action="server-start",
                                  booking_id=booking_id, ok=True,
                                  details={"server": server_id, "port": port, "model": values["model"],
                                           "cards": values["cards"]})
                return server_id, port
            except NotPermitted as refusal:
                self._refused("server-start", booking_id, details, refusal)
            except sqlite3.IntegrityError:
                continue  # another board leased this port a moment ago
        self._refused("server-start", booking_id, details, Conflict(
            f"no free port in {settings.port_min}-{settings.port_max}; stop a server or widen llama.port_min/port_max"))
        raise AssertionError("unreachable")

    def _launch(self, server: Server) -> None:
        try:
            log_path, fd = logs.open_log(Path(server.log_path).parent, server.id)
        except OSError as error:
            raise BoardError(f"can't write the server log {server.log_path}: {error.strerror}") from None
        try:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(self.clock()))
            header = (f"board: {stamp} server {server.id} for booking {server.booking_id} ({server.user}),"
                      f" cards {','.join(map(str, server.cards))},"
                      f" CUDA_VISIBLE_DEVICES={','.join(server.card_uuids)}\n"
                      f"board: {' '.join(server.cmdline)}\n")
            os.write(fd, header.encode("utf-8", "replace"))
            argv = [sys.executable, SUPERVISOR, "--db", str(Path(self.config.db_path).resolve()),
                    "--server", str(server.id), "--host", server.host, "--port", str(server.port),
                    "--ready-timeout", str(self.config.llama.ready_timeout_s), "--backstop", str(_backstop(self.environ)),
                    "--", *server.cmdline]
            try:
                child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, close_fds=True,
                                         start_new_session=True, env=cmd.server_env(server.card_uuids, self.environ))
            except OSError as error:
                raise BoardError(f"can't start the supervisor: {error.strerror or error}") from None
        finally:
            os.close(fd)
        # Reap it if it ends while we still run (a long-lived TUI); otherwise init inherits it.
        threading.Thread(target=child.wait, name=f"reap-supervisor-{server.id}", daemon=True).start()
        found = capture(child.pid)
        with write(self.conn):
            rows.set_supervisor(self.conn, server.id, child.pid, found.started if found else None,
                                found.cmdline if found else argv, pgid=child.pid)

    # -- ready ---------------------------------------------------------------------------------

    def wait_ready(self, server: Server, *, progress: Callable[[float], None] | None = None,
                   poll_s: float = 0.02, timeout: float | None = None) -> Server:
        """Poll /health until 200; BoardError when the server crashes, fails or stops instead."""
        started = time.monotonic()
        limit = timeout if timeout is not None else self.config.llama.ready_timeout_s + 15
        next_row = started + 0.25
        while True:
            if health.health(server.host, server.port, timeout=1.0) == 200:
                with write(self.conn):
                    rows.transition(self.conn, server.id, [rows.STARTING], rows.READY, ready_at=int(self.clock()))
                return self._with_pid(server.id)
            now = time.monotonic()
            if now >= next_row:
                next_row = now + 0.25
                current = self._reconcile_one(self.get(server.id))  # a supervisor that died says nothing
                if current.state == rows.READY:
                    return self._with_pid(server.id)
                if current.state != rows.STARTING:
                    if current.state == rows.STOPPING:
                        raise BoardError(f"server {server.id} is being stopped ({current.reason or 'on request'})")
                    raise ServerEnded(current)
                if progress is not None:
                    progress(now - started)
            if now - started > limit:
                raise BoardError(f"server {server.id} is not ready after {limit:.0f} s; see 'board serve logs {server.id}'")
            time.sleep(poll_s)

    def _with_pid(self, server_id: int, timeout: float = 5.0) -> Server:
        """The row with llama-server's pid. The supervisor records it right after launch, but its imports
        can take longer than a tiny model takes to load: then we record it, from the supervisor's child."""
        deadline = time.monotonic() + timeout
        current = self.get(server_id)
        while current.pid is None and current.live and time.monotonic() < deadline:
            found = _child_of(current)
            if found is not None:
                with write(self.conn):
                    rows.set_process(self.conn, server_id, found.pid, found.started, found.cmdline,
                                     only_if_unset=True)
            else:
                time.sleep(0.005)
            current = self.get(server_id)
        return current

    # -- stop ----------------------------------------------------------------------------------

    def stop(self, server_id: int, *, reason: str | None = None, enforce: bool = False, wait: bool = True) -> Server:
        """Stop a server: SIGTERM to its process group, SIGKILL after 10 s, until no process of it is left.

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
            self._wait_group(server)
            self._finish_stop(server)
        return self.get(server.id)

    def _wait_group(self, server: Server) -> None:
        """Wait until the group is empty; SIGKILL whatever is left a little after KILL_AFTER_S.

        The supervisor SIGKILLs llama-server itself at KILL_AFTER_S and records the exit status; the
        group SIGKILL here comes a moment later, for a supervisor that could not. It needs no second
        identity check: the group was verified as ours when it got SIGTERM and has had members at
        every poll since, so its number cannot have been reused.
        """
        deadline = time.monotonic() + KILL_AFTER_S + SUPERVISOR_GRACE_S
        killed = False
        delay = 0.005
        while group_members(server.pgid):
            if time.monotonic() >= deadline:
                if killed:
                    return  # unkillable (D state); the row still says stopping, and reconcile will finish it
                try:
                    os.killpg(server.pgid, signal.SIGKILL)
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
        for server in rows.live(self.conn):
            after = self._reconcile_one(server)
            if after.state != server.state:
                changed.append(after)
        return changed

    def _reconcile_one(self, server: Server) -> Server:
        if not server.live or _alive(server):
            return server
        now = int(self.clock())
        if server.supervisor_pid is None and now - server.created_at < LAUNCH_GRACE_S:
            return server
        with write(self.conn):
            if server.state == rows.STOPPING:
                rows.transition(self.conn, server.id, [rows.STOPPING], rows.STOPPED, ended_at=now)
            else:
                reason = "the server and its supervisor are gone; exit status unknown"
                if rows.transition(self.conn, server.id, [server.state], rows.CRASHED, reason=reason, ended_at=now,
                                   log_tail=logs.tail(server.log_path)):
                    events.record(self.conn, ts=now, uid=self.me.uid, actor=self.me.name, action="server-crash",
                                  booking_id=server.booking_id, ok=True,
                                  details={"server": server.id, "exit": "unknown", "found_by": self.me.name})
        return self.get(server.id)

    def enforce_booking_end(self) -> list[Server]:
        """Stop every live server whose booking has ended or was cancelled."""
        stopped = []
        for server in rows.ended_bookings(self.conn, int(self.clock())):
            stopped.append(self.stop(server.id, reason=f"booking {server.booking_id} ended", enforce=True))
        return stopped

    def ending_soon(self, within_s: int = WARN_BEFORE_END_S) -> list[tuple[Server, int]]:
        """(server, seconds left) for live servers whose booking ends within `within_s`."""
        now = int(self.clock())
        found = []
        for server in rows.live(self.conn):
            booking = booking_rows.get(self.conn, server.booking_id)
            if booking and booking.status == "booked" and now < booking.end <= now + within_s:
                found.append((server, booking.end - now))
        return found

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


class ServerEnded(BoardError):
    """The server crashed, failed or stopped while we waited for it to be ready."""

    def __init__(self, server: Server):
        what = server.reason or server.exit_text or "no reason recorded"
        super().__init__(f"server {server.id} {server.state}: {what}; see 'board serve logs {server.id}'")
        self.server = server


def _positive(flag: str, value) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise BadInput(f"{flag} must be a whole number, not {value!r}") from None
    if number < 1:
        raise BadInput(f"{flag} must be at least 1")
    return number


def _backstop(environ: Mapping[str, str]) -> float:
    try:
        return float(environ.get("BOARD_LLAMA_BACKSTOP_S", BACKSTOP_S))
    except ValueError:
        return BACKSTOP_S


def _identities(server: Server) -> list[ProcessIdentity]:
    found = []
    if server.pid is not None:
        found.append(ProcessIdentity(server.pid, server.pid_started, server.cmdline))
    if server.supervisor_pid is not None:
        found.append(ProcessIdentity(server.supervisor_pid, server.supervisor_started, server.supervisor_cmdline))
    return found


def _child_of(server: Server) -> ProcessIdentity | None:
    """llama-server's identity, found as the verified supervisor's child running the recorded command."""
    if server.supervisor_pid is None:
        return None
    supervisor = ProcessIdentity(server.supervisor_pid, server.supervisor_started, server.supervisor_cmdline)
    if check(supervisor) != "match":
        return None
    import psutil

    try:
        children = psutil.Process(server.supervisor_pid).children()
    except psutil.Error:
        return None
    for child in children:
        found = capture(child.pid)
        if found is not None and found.cmdline == server.cmdline:
            return found
    return None


def _alive(server: Server) -> bool:
    """True when the server or its supervisor still runs (or cannot be inspected, so might)."""
    return any(check(i) in ("match", "hidden") for i in _identities(server))

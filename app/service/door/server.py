"""`board agent`'s socket: accept members, learn who they are from the kernel, answer, push changes, enforce.

The accepting thread decides at the door: who is at the other end (the kernel's record of the
connecting process, app.service.conn.peer), whether they are a member, and whether their uid's cap and
the global cap have room. Only then does a connection get its thread; a refused one gets one line
and is closed at once, unread. So a flood costs at most the caps' threads and files, and the caps
leave room below the open-file limit for the database, pidfds and /metrics.

A client that says nothing or reads nothing holds only its own thread, for a bounded time: each
request line has one deadline for the whole line (app.service.conn.deadline), each answer a send
timeout. Every operation runs on one database thread, in arrival order: the service is the only
writer, so BEGIN IMMEDIATE never waits on anyone; bookings that wait together commit together (app.service.door.writer).
"""

from __future__ import annotations

import errno
import grp
import logging
import os
import resource
import signal
import socket
import stat
import threading
import time
from typing import Any

from app import wire
from app.alerts.engine import Engine
from app.core.identity import Identity
from app.errors import BadInput, BoardError, NotPermitted
from app.faults.watcher import start_watcher
from app.gpu.model import snapshot_to_wire
from app.history.sampler import start_sampler
from app.model import booking_to_wire
from app.service import Service
from app.service.rules.audit import audit
from app.service.conn.deadline import Lines
from app.service.fleet.hosts import start_heartbeat
from app.service.box.enforce import enforce_once, run_booking
from app.service.conn.peer import Peer, identity_of, is_member, peer_of
from app.service.box.processes import RegistrationError
from app.service.rules.plans import runner_registration
from app.service.box.servers import adopt_servers, serve_registration
from app.service.box.watch import start_watchers
from app.service.door.writer import DatabaseThread
from app.store import events, jobs
from app.store.db import write
from app.store.pg import where as pg_where

SEND_TIMEOUT_S = 10.0  # an answer (or a stream's batch of events) goes out whole within this, or the line is closed
LINE_TIMEOUT_S = 10.0  # a request line arrives whole within this of its first byte, or the line is closed
# Open files the connections leave to the rest: the database's and history's files, the pidfds of registered
# processes, the GPUs' device files, /metrics (at most app.service.box.metrics.MAX_SCRAPES) and the listeners.
FD_RESERVE = 128
ACCEPT_BACKOFF_S = (0.05, 1.0)  # accept() failing (out of files): wait this long, doubling up to the second
ACCEPT_LOG_EVERY_S = 60.0  # and say so in the log at most this often

log = logging.getLogger(__name__)


class ServiceServer:
    def __init__(self, service: Service, path: str) -> None:
        self.service, self.path = service, path
        self.settings = service.config.service
        self.registry = service.processes
        self.database = DatabaseThread(service)  # every operation, in arrival order; bookings commit in groups
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._per_uid: dict[int, int] = {}
        self._connections: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.max_connections = connection_cap(self.settings.max_connections, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self._accept_failures, self._accept_logged_at = 0, float("-inf")
        self.alerts = Engine()  # the alerts' engine, run by each enforcement pass (app.service.box.alerts)
        self.idle_told: dict[int, tuple[float, float]] = {}  # idle bookings told of (app.service.box.idle)
        self.started_told_until: float | None = None  # bookings that started by then have been announced (enforce)

    # -- the socket ----------------------------------------------------------------------------

    def bind(self) -> socket.socket:
        """Create the socket 0660, group [service] group; a stale socket file is replaced, anything else refused."""
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            info = None
        if info is not None:
            if not stat.S_ISSOCK(info.st_mode):
                raise BoardError(f"{self.path} exists and is not a socket; remove it or pick another [service] socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
            except (ConnectionRefusedError, FileNotFoundError):
                os.unlink(self.path)
            else:
                raise BoardError(f"another board service already answers on {self.path}")
            finally:
                probe.close()
        try:
            gid = grp.getgrnam(self.settings.group).gr_gid
        except KeyError:
            raise BoardError(f"the members' group {self.settings.group!r} does not exist; create it or fix"
                             " [service] group") from None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o117)  # 0660 from the start; the group follows before listen()
        try:
            listener.bind(self.path)
        finally:
            os.umask(old)
        os.chown(self.path, -1, gid, follow_symlinks=False)
        listener.listen(128)
        self._listener = listener
        return listener

    def serve_forever(self) -> None:
        service = self.service
        listener = self.bind() if self._listener is None else self._listener
        self.database.submit(self.adopt_jobs).result()
        self.database.submit(adopt_servers, self).result()
        watchers = start_watchers(service)
        # this host's heartbeat and snapshot for the fleet, on the database thread
        start_heartbeat(service, lambda fn: self.database.submit(fn).result(), self.stopping)
        enforcer = threading.Thread(target=self._enforce_loop, name="board-enforce", daemon=True)
        enforcer.start()
        # the helpers below log what failed, and when it works again: warnings
        history = start_sampler(service.fleet, service.history, service.config, service.clock,
                                log=logging.getLogger("app.history").warning)
        # pushes to the team's chat: HTTP on its own thread, the outbox on the database thread
        service.start_notifier(lambda fn: self.database.submit(fn).result(), logging.getLogger("app.notify").warning,
                               self.stopping)
        # Xid events and throttling spells
        faults, faults_thread = start_watcher(service.fleet, service.config.store, service.clock,
                                              log=logging.getLogger("app.faults").warning)
        listener.settimeout(0.5)
        try:
            backoff = 0.0
            while not self.stopping.is_set():
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    continue
                except OSError as error:  # EMFILE, ENFILE, ENOBUFS: the connection waits in the backlog meanwhile
                    if self.stopping.is_set():
                        break
                    self._accept_failed(error)
                    backoff = min(max(backoff * 2, ACCEPT_BACKOFF_S[0]), ACCEPT_BACKOFF_S[1])
                    self.stopping.wait(backoff)
                    continue
                backoff = 0.0
                self._door(conn)
        finally:
            watchers.set()
            if history is not None:
                history.set()
            faults.set()
            faults_thread.join(timeout=5)  # it records the throttling still on before it goes
            listener.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass
            with self._lock:
                for conn in list(self._connections):
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            self.database.shutdown(wait=True)

    def stop(self) -> None:
        self.stopping.set()

    def _accept_failed(self, error: OSError) -> None:
        """A logged, passing condition: the first failure, then at most a line a minute with the count."""
        self._accept_failures += 1
        now = time.monotonic()
        if now - self._accept_logged_at >= ACCEPT_LOG_EVERY_S:
            name = errno.errorcode.get(error.errno or 0, "error")
            log.warning(f"board agent: can't accept connections ({error.strerror or error}, {name};"
                        f" {self._accept_failures} time(s) since the last such line); waiting, and serving the"
                        " connections it has")
            self._accept_failures, self._accept_logged_at = 0, now

    # -- one connection ------------------------------------------------------------------------

    def _door(self, conn: socket.socket) -> None:
        """Admit or refuse a new connection, on the accepting thread: only one admitted, and counted against its
        uid's cap and the global cap, gets a thread."""
        try:
            peer = peer_of(conn)
        except OSError:  # the kernel could not say who it is (SO_PEERGROUPS needs Linux 4.13+): nobody
            conn.close()
            return
        refusal = self._admit(conn, peer)
        if refusal is None:
            try:
                threading.Thread(target=self._serve_connection, args=(conn, peer), name="board-connection",
                                 daemon=True).start()
                return
            except RuntimeError:  # no thread to be had (the system's limits): as good as full
                self._release(conn, peer)
                refusal = BoardError("the board service has too many connections; try again shortly")
        # debug: a flood is refused here, a line each, so its lines are written only when asked for
        log.debug(f"board agent: refused {peer.name} (uid {peer.uid}, pid {peer.pid}) at the door: {refusal}")
        _refuse(conn, refusal)

    def _admit(self, conn: socket.socket, peer: Peer) -> BoardError | None:
        """None, with the connection counted, when `peer` may come in; else why not."""
        if not is_member(peer, self.settings.group, self.service.config.admin_group):
            return NotPermitted(f"no access to the board: ask an admin to add you to group {self.settings.group}")
        per_uid = self.settings.max_connections_per_uid
        with self._lock:
            crowded = len(self._connections) >= self.max_connections
            if not crowded and self._per_uid.get(peer.uid, 0) < per_uid:
                self._per_uid[peer.uid] = self._per_uid.get(peer.uid, 0) + 1
                self._connections.add(conn)
                return None
        if crowded:
            return BoardError(f"the board service has too many connections (at most {self.max_connections});"
                              " try again shortly")
        return BoardError(f"too many connections from {peer.name} (at most {per_uid}); close some boards")

    def _release(self, conn: socket.socket, peer: Peer) -> None:
        with self._lock:
            self._per_uid[peer.uid] -= 1
            if not self._per_uid[peer.uid]:
                del self._per_uid[peer.uid]
            self._connections.discard(conn)

    def _serve_connection(self, conn: socket.socket, peer: Peer) -> None:
        me = None
        try:
            conn.settimeout(SEND_TIMEOUT_S)
            reader = Lines(conn, line_s=LINE_TIMEOUT_S, limit=wire.MAX_MESSAGE + 1)
            while not self.stopping.is_set():
                line = reader.readline(self.settings.idle_timeout_s)
                if not line:
                    return
                if len(line) > wire.MAX_MESSAGE:
                    self.reply(conn, None, error=BadInput(f"a message is at most {wire.MAX_MESSAGE} bytes"))
                    return  # the rest of the line cannot be skipped reliably
                request_id, error = None, None
                message: dict[str, Any] = {}  # the request, once its line decodes
                try:
                    message = wire.decode(line)
                    request_id = message.get("id")
                    if message.get("v") not in wire.VERSIONS:
                        raise BadInput(f"protocol version {str(message.get('v'))[:10]} is not spoken here; this"
                                       f" service speaks {', '.join(map(str, wire.VERSIONS))}")
                except ValueError:
                    error = BadInput("a request is one JSON object on one line")
                except BadInput as refused:
                    error = refused
                if error is not None:
                    self.reply(conn, request_id, error=error)
                    continue
                op = message.get("op")
                if op == "subscribe":
                    return self._subscribe(conn, peer, request_id, message.get("args") or {})
                if op == "register":
                    return self._register(conn, reader, peer, request_id, message.get("args") or {})
                if me is None:  # once per connection: the passwd and group lookups are not free
                    me = identity_of(peer, self.service.config.admin_group)
                self.reply(conn, request_id, *self._call(me, op, message.get("args")))
        except OSError:  # the client went away, or ran out of time (TimeoutError)
            return
        finally:
            self._release(conn, peer)
            conn.close()

    def _call(self, me: Identity, op: Any, args: Any) -> tuple[Any, BoardError | None]:
        future = self.database.call(me, op, args)
        try:
            return future.result(), None
        except BoardError as error:
            return None, error
        except Exception as error:  # noqa: BLE001 - one bad request must not end the service
            log.error(f"{op}: unexpected {type(error).__name__}: {error}")
            return None, BoardError(f"the service failed on {str(op)[:40]}: {type(error).__name__}; see its log")

    def reply(self, conn: socket.socket, request_id: Any, result: Any = None, error: BoardError | None = None) -> None:
        """One answer on `conn`; the handlers it hands itself to (app.service.conn.agent) answer through it too."""
        conn.sendall(_answer(request_id, result, error))

    def _subscribe(self, conn: socket.socket, peer: Peer, request_id: Any, args: dict) -> None:
        kinds = args.get("kinds") if isinstance(args, dict) else None
        known = {"bookings", "servers", "fleet", "notice", "gateway"}
        if not isinstance(kinds, list) or not kinds or not all(isinstance(k, str) and k in known for k in kinds):
            self.reply(conn, request_id, error=BadInput(f"subscribe: kinds is a list of {', '.join(sorted(known))}"))
            return
        subscriber = self.service.hub.subscribe(kinds, peer.uid)
        try:
            self.reply(conn, request_id, {"versions": dict(self.service.hub.versions)})
            if "gateway" in kinds:  # read gateway_state now: a change before this subscription is not missed
                conn.sendall(wire.encode({"event": "gateway", "version": self.service.hub.versions["gateway"]}))
            if "fleet" in kinds and (snapshot := self.service.fleet.cached()) is not None:
                conn.sendall(wire.encode({"event": "fleet", "snapshot": snapshot_to_wire(snapshot)}))
            while not self.stopping.is_set():
                batch = subscriber.take(timeout=1.0)
                if batch:
                    conn.sendall(b"".join(wire.encode(e) for e in batch))  # a reader that stalls times out here
                elif _peer_closed(conn):
                    return
        finally:
            self.service.hub.unsubscribe(subscriber)

    # -- registered processes ------------------------------------------------------------------

    def _register(self, conn: socket.socket, reader: Lines, peer: Peer, request_id: Any, args: dict) -> None:
        me = identity_of(peer, self.service.config.admin_group)
        kind = args.get("kind") if isinstance(args, dict) else None
        if kind == "server":  # a llama-server supervisor: app.service.box.servers says how
            return serve_registration(self, conn, reader, peer, request_id, args)
        if kind == "runner":  # `board runner`, which starts planned servers: app.service.rules.plans
            return runner_registration(self, conn, reader, peer, request_id, args)
        booking_id = args.get("booking") if isinstance(args, dict) else None
        if kind != "job" or (booking_id is not None and (not isinstance(booking_id, int) or isinstance(booking_id, bool))):
            self.reply(conn, request_id, error=BadInput("register: give kind \"job\" and an optional booking number,"
                                                         " or kind \"server\" and the server id"))
            return

        def admit():
            booking = run_booking(self.service, me, booking_id)
            try:
                entry = self.registry.add(kind, booking.id, peer.uid, peer.pid, booking.card_uuids)
            except RegistrationError as error:
                audit(self.service, me, "run", booking.id, ok=False, details={"refused": str(error), "pid": peer.pid})
                raise NotPermitted(str(error)) from None
            with write(self.service.conn):
                jobs.remember(self.service.conn, pid=entry.pid, started_ticks=entry.started_ticks, booking_id=booking.id,
                              uid=entry.uid, pgid=entry.pgid, cards=entry.cards, now=int(self.service.clock()),
                              host=self.service.host)
                events.record(self.service.conn, ts=int(self.service.clock()), uid=me.uid, actor=me.name, action="run",
                              booking_id=booking.id, ok=True, details={"pid": entry.pid, "pgid": entry.pgid})
            return booking, entry

        try:
            booking, entry = self.database.submit(admit).result()
        except BoardError as error:
            self.reply(conn, request_id, error=error)
            return
        self.reply(conn, request_id, {"booking": booking_to_wire(booking), "registration": entry.id})
        try:
            while reader.readline(None):
                pass  # nothing more is expected; the line stays open while the job lives
        except OSError:
            pass
        self.registry.disconnected(entry)

    def adopt_jobs(self) -> list[int]:
        """After a restart: take back the `board run` jobs this service knew, where the very process (same
        pid, start time and uid) still runs; forget the rest. Returns the pids adopted."""
        adopted = []
        with write(self.service.conn):
            for job in jobs.remembered(self.service.conn, self.service.host):
                try:
                    entry = self.registry.add("job", job["booking_id"], job["uid"], job["pid"], job["cards"],
                                              started_ticks=job["started_ticks"], pgid=job["pgid"])
                except RegistrationError:
                    jobs.forget(self.service.conn, job["pid"], job["started_ticks"])
                else:
                    self.registry.disconnected(entry)
                    adopted.append(entry.pid)
        if adopted:
            log.info(f"board agent: took back {len(adopted)} running job(s): pids {', '.join(map(str, adopted))}")
        return adopted

    def _enforce_loop(self) -> None:
        while not self.stopping.is_set():
            self.service.wake_enforcer.wait(self.service.config.enforce.interval_s)
            self.service.wake_enforcer.clear()
            if self.stopping.is_set():
                return
            try:
                self.database.submit(self.enforce_once).result()
            except Exception as error:  # noqa: BLE001 - a service must outlive one bad pass
                log.error(f"enforcement pass failed: {type(error).__name__}: {error}")

    def enforce_once(self) -> dict[str, list[int]]:
        return enforce_once(self)


def _answer(request_id: Any, result: Any = None, error: BoardError | None = None) -> bytes:
    if error is None:
        return wire.encode({"id": request_id, "ok": True, "result": result})
    said = {"code": error.exit_code, "message": str(error)}
    if (search := getattr(error, "earliest", None)) is not None:
        said["earliest"] = search  # the client asks for the message's second half (op earliest) when it shows it
    return wire.encode({"id": request_id, "ok": False, "error": said})


def _refuse(conn: socket.socket, error: BoardError) -> None:
    """Say why in one line and close, at once and without reading: a refused client costs no thread and no
    wait. Its request, if it sent one, is never read; the client still finds this line (app/client/socket.py)."""
    try:
        conn.send(_answer(None, error=error), socket.MSG_DONTWAIT)
    except OSError:
        pass
    conn.close()


def connection_cap(wanted: int, open_files: int) -> int:
    """[service] max_connections, lowered where the open-file limit could not hold it and FD_RESERVE."""
    if open_files == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, open_files - FD_RESERVE))


def raise_file_limit() -> int:
    """The soft open-file limit raised to the hard one (systemd's default soft limit is 1024); returns the limit.
    A second line of defence: the caps alone keep a flood from using up the files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # a hard limit of infinity is more than the kernel's nr_open allows
            return soft
    return hard


def _peer_closed(conn: socket.socket) -> bool:
    try:
        conn.setblocking(False)
        try:
            data = conn.recv(1, socket.MSG_PEEK)
        finally:
            conn.setblocking(True)
            conn.settimeout(SEND_TIMEOUT_S)
        return data == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def run_agent(service: Service, path: str) -> int:
    open_files = raise_file_limit()
    server = ServiceServer(service, path)
    server.bind()
    metrics = None
    if service.config.metrics.listen:  # Prometheus's /metrics; prometheus-client is loaded only then
        from app.service.box.metrics import MetricsServer  # start-up: prometheus-client loads only with [metrics] listen

        metrics = MetricsServer(service, logging.getLogger("app.service.box.metrics").warning)  # its failures
        log.info(f"board agent: /metrics on {service.config.metrics.listen}")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.stop())
    url = service.config.storage_url  # a PostgreSQL store: its address (never a password), not a file it does not use
    store = f"PostgreSQL {pg_where(url)}" if url else service.config.db_path
    log.info(f"board agent: serving {path} (group {server.settings.group}) on {store}"
             f" as uid {os.getuid()}; at most {server.max_connections} connections,"
             f" {server.settings.max_connections_per_uid} per user; {open_files} open files")
    if server.max_connections < server.settings.max_connections:
        log.warning(f"board agent: [service] max_connections is {server.settings.max_connections}, but {open_files} open files"
                    f" hold {server.max_connections} beside the rest; raise LimitNOFILE= in the unit")
    server.serve_forever()
    if metrics is not None:
        metrics.close()
    log.info("board agent: stopped")
    return 0

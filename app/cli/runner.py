"""`board runner`: starts planned servers (`board serve plan`) for the service, as the system user board-llama.

Run by its own unit (app/systemd/board-runner.service) with no capabilities. It connects to the service's
socket and registers (kind "runner"; the service takes only the uid of `[llama] runner_user`), then waits
for `start` instructions on that connection. For each it spawns the server's supervisor as itself
(app.llama.launch, exactly as `board serve start` does for a member), which registers the server with the
service; the service then signals it through its pidfd and stops it at the booking's end, as every server.
It never opens the database: the row and the grant come from the service. When the service goes away
(a restart) it registers again once a second; the servers it started keep running (app.llama.supervisor).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from datetime import datetime

from app.errors import BadInput, BoardError, NotPermitted
from app.wire import decode, encode

RECONNECT_S = 1.0


def add_runner(command) -> None:
    command("runner", cmd_runner, "start planned servers for the board service (run by board-runner.service as"
            " the user board-llama)")


def _log(message: str) -> None:
    from app.core.text import inert

    print(f"{datetime.now().astimezone().strftime('%Y-%m-%d %H:%M:%S')} {inert(message, 500)}", flush=True)


def cmd_runner(ctx) -> int:
    path = ctx.config.service.socket
    if not path:
        raise BadInput("board runner starts planned servers for the board service; this config names no"
                       " [service] socket")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _check_state(ctx.environ)
    _log(f"board runner: uid {os.getuid()}, service {path}")
    told = False
    while True:
        try:
            sock, reader = _register(path)
        except NotPermitted as refusal:
            raise NotPermitted(f"the service refused the runner: {refusal}") from None
        except OSError as error:
            if not told:
                _log(f"board runner: can't reach the service at {path} ({error.strerror or error}); trying"
                     " again every second")
                told = True
            time.sleep(RECONNECT_S)
            continue
        told = False
        _log("board runner: registered with the service")
        try:
            for line in reader:
                _handle(line, path, ctx.environ, sock)
        except OSError:
            pass
        sock.close()
        _log("board runner: lost the service; registering again (the servers keep running)")


def _check_state(environ) -> None:
    """Refuse to run where the servers' logs cannot be written (before, it registered and every planned server
    then ended as 'crashed; exit status unknown')."""
    import tempfile  # start-up: only here

    from app.llama.launch import own_log_dir  # start-up: llama's modules load only for servers

    directory = own_log_dir(environ)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise BoardError(f"the runner can't write its state directory {directory} ({error.strerror or error}):"
                         " the servers' logs go there; give the runner's user a writable StateDirectory="
                         " (XDG_STATE_HOME)") from None


def _register(path: str):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    try:
        sock.connect(path)
        sock.sendall(encode({"v": 1, "id": 1, "op": "register", "args": {"kind": "runner"}}))
        reader = sock.makefile("rb")
        reply = reader.readline(1 << 20)
    except OSError:
        sock.close()
        raise
    try:
        answer = decode(reply) if reply else {}
    except ValueError:
        answer = {}
    if not answer.get("ok"):
        sock.close()
        if answer.get("error"):
            raise NotPermitted(answer["error"].get("message") or "refused")
        raise ConnectionResetError("the service closed the connection")
    sock.settimeout(None)  # instructions come when bookings start: hours apart
    return sock, reader


def _handle(line: bytes, path: str, environ, sock: socket.socket) -> None:
    from app.llama import launch
    from app.llama.rows import server_from_wire

    try:
        message = decode(line)
        if message.get("event") != "start":
            return
        server = server_from_wire(message["server"])
        grant = message["launch"]
    except (ValueError, KeyError, TypeError) as error:
        _log(f"board runner: ignored an instruction it could not read ({error})")
        return
    try:
        log_path = launch.launch(server, grant, socket_path=path, environ=environ)
    except BoardError as error:
        _log(f"board runner: server {server.id} for booking {server.booking_id} ({server.user}): not started: {error}")
        try:  # the reason goes on the server's row (app.service.rules.plans.runner_registration)
            sock.sendall(encode({"event": "failed", "server": server.id, "reason": f"the runner: {error}"}))
        except OSError:
            pass
        return
    _log(f"board runner: started server {server.id} for booking {server.booking_id} ({server.user}),"
         f" port {server.port}; log {log_path}")

"""The client's half of `serve start` and `serve stop`: launch the granted server as yourself, then watch its row.

`serve_start` (app.service.box.servers) checks and leases, and returns the row plus what a launch
needs. The caller's own process then spawns the supervisor (app.llama.supervisor) as the
caller, detached, with its stdio on the server's log:

- over the socket, the log lives in the member's own state directory (the service can't write
  there and never opens it), and the supervisor registers with the service (`--socket`);
- in file mode, the log lives beside the user's own database, and the supervisor writes that
  database itself (`--db`).

Waiting (for ready, for the end of a stop) is the caller's too: it polls `serve_get`, which
reconciles first, so a supervisor that died is noticed within a poll. The same code runs for
the CLI and the TUI, over either transport.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from app.core.request import readable
from app.errors import BadInput, BoardError
from app.fit.gguf_model import read_model
from app.fit.request import for_server, settings_of
from app.llama import command as cmd
from app.llama import logs, rows
from app.llama.rows import Server, server_from_wire

SUPERVISOR = str(Path(__file__).resolve().with_name("supervisor.py"))
KILL_AFTER_S = 10.0
BACKSTOP_S = 60.0


class ServerEnded(BoardError):
    """The server crashed, failed or stopped while we waited for it to be ready."""

    def __init__(self, server: Server):
        what = server.reason or server.exit_text or "no reason recorded"
        super().__init__(f"server {server.id} {server.state}: {what}; see 'board serve logs {server.id}'")
        self.server = server


def own_log_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where a member's server logs go in the shared install: $XDG_STATE_HOME/board/servers."""
    state = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "board" / "servers"


def start(client, booking_id: int, *, socket_path: str | None = None, environ: Mapping[str, str] = os.environ,
          fit_limits: Mapping | None = None, force: bool = False, **options) -> tuple[Server, dict]:
    """serve_start, then launch: the row (state `starting`) of a server whose supervisor now runs, and
    the grant (ready_timeout_s). With `fit_limits` (app.fit.request.limits), a server whose estimate does
    not fit the booked cards is refused (NotPermitted) unless `force`; the estimate goes into the audit row."""
    booking = client.call("get", id=booking_id)
    request = readable(booking.get("request"))  # the well-formed fields of what is stored
    model = options.get("model") or request.get("model")
    if model:  # checked here, by the member's own process: the service never opens a path a client sent
        options["model"] = cmd.check_model(model)
        if fit_limits is not None:
            options.update(_fit(options, request, fit_limits, len(booking["cards"]), force))
    granted = client.call("serve_start", booking=booking_id, **{k: v for k, v in options.items() if v is not None})
    server = server_from_wire(granted["server"])
    try:
        cmd.check_files(server.cmdline, granted["launch"].get("model_dirs") or ())
        launch(server, granted["launch"], socket_path=socket_path if client.transport == "socket" else None,
               environ=environ)
    except BoardError as error:
        try:
            client.call("serve_stop", id=server.id, reason=f"launch failed: {error}")
        except BoardError:
            pass
        raise
    return server, granted["launch"]


def plan(client, *, booking: int | None = None, series: int | None = None, fit_limits: Mapping | None = None,
         force: bool = False, **options) -> dict:
    """serve_plan, with the model checked and the estimate made by the member's own process, as `start` does
    (for a series, against its first occurrence's cards and request): the plan as the service returns it."""
    if booking is not None:
        occurrence = client.call("get", id=booking)
    else:
        occurrences = client.call("series_get", id=series)["bookings"] if series is not None else []
        occurrence = occurrences[0] if occurrences else None
    request = readable(occurrence.get("request")) if occurrence else {}
    model = options.get("model") or request.get("model")
    if model:
        options["model"] = cmd.check_model(model)
        if fit_limits is not None and occurrence is not None:
            options.update(_fit(options, request, fit_limits, len(occurrence["cards"]), force, "serve plan"))
    return client.call("serve_plan", booking=booking, series=series,
                       **{k: v for k, v in options.items() if v is not None})


def _fit(options: dict, request: dict, limits: Mapping, cards: int, force: bool, command: str = "serve start") -> dict:
    """The settings the estimate was made for (so the server runs exactly those) and the estimate itself."""
    flash = {"on": True, "off": False}.get(options.get("flash_attn", ""))
    settings = settings_of(request, ctx=options.get("ctx"), parallel=options.get("parallel"),
                           cache_type_k=options.get("cache_type_k"), cache_type_v=options.get("cache_type_v"),
                           flash_attn=flash)
    try:
        model = read_model(options["model"])
    except BadInput:
        return {}  # board can't size it (an architecture it does not know): llama-server itself will tell
    estimate = for_server(model, settings, dict(limits), cards, force=force, command=command)
    return {"ctx": settings.ctx, "parallel": settings.parallel, "cache_type_k": settings.cache_type_k,
            "cache_type_v": settings.cache_type_v, "flash_attn": "on" if settings.flash_attn else "off", "fit": estimate}


def launch(server: Server, grant: Mapping, *, socket_path: str | None, environ: Mapping[str, str] = os.environ) -> str:
    """Spawn the supervisor for `server`, detached; returns the log path."""
    if socket_path:
        directory, reporting = own_log_dir(environ), ["--socket", socket_path]
    else:
        directory, reporting = Path(server.log_path).parent, ["--db", str(grant["db"])]
    try:
        log_path, fd = logs.open_log(directory, server.id)
    except OSError as error:
        raise BoardError(f"can't write the server log in {directory}: {error.strerror}") from None
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
        header = (f"board: {stamp} server {server.id} for booking {server.booking_id} ({server.user}),"
                  f" cards {','.join(map(str, server.cards))},"
                  f" CUDA_VISIBLE_DEVICES={','.join(server.card_uuids)}\n"
                  f"board: {' '.join(server.cmdline)}\n")
        os.write(fd, header.encode("utf-8", "replace"))
        argv = [sys.executable, SUPERVISOR, *reporting, "--server", str(server.id), "--host", server.host,
                "--port", str(server.port), "--ready-timeout", str(grant["ready_timeout_s"]),
                "--backstop", str(_backstop(environ)), "--log", log_path,
                "--model-dirs", "\n".join(grant.get("model_dirs") or ()), "--", *server.cmdline]
        try:
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, close_fds=True,
                                     start_new_session=True, env=cmd.server_env(server.card_uuids, environ))
        except OSError as error:
            raise BoardError(f"can't start the supervisor: {error.strerror or error}") from None
    finally:
        os.close(fd)
    # Reap it if it ends while we still run (a long-lived TUI); otherwise init inherits it.
    threading.Thread(target=child.wait, name=f"reap-supervisor-{server.id}", daemon=True).start()
    return log_path


def get(client, server_id: int) -> Server:
    return server_from_wire(client.call("serve_get", id=server_id))


def wait_ready(client, server: Server, *, timeout: float, progress: Callable[[float], None] | None = None,
               poll_s: float = 0.05) -> Server:
    """Until the row says ready; ServerEnded when it crashes, fails or stops instead."""
    started = time.monotonic()
    while True:
        current = get(client, server.id)
        if current.state == rows.READY:
            return current
        if current.state != rows.STARTING:
            if current.state == rows.STOPPING:
                raise BoardError(f"server {server.id} is being stopped ({current.reason or 'on request'})")
            raise ServerEnded(current)
        elapsed = time.monotonic() - started
        if progress is not None:
            progress(elapsed)
        if elapsed > timeout:
            raise BoardError(f"server {server.id} is not ready after {timeout:.0f} s; see 'board serve logs {server.id}'")
        time.sleep(poll_s)


def stop(client, server_id: int, *, timeout: float = KILL_AFTER_S + 8) -> Server:
    """serve_stop, then wait until the row is final (the service returns `stopping` at once)."""
    server = server_from_wire(client.call("serve_stop", id=server_id))
    return wait_final(client, server, timeout) if server.live else server


def wait_final(client, server: Server, timeout: float) -> Server:
    deadline = time.monotonic() + timeout
    delay = 0.02
    while server.live and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
        server = get(client, server.id)
    return server


def _backstop(environ: Mapping[str, str]) -> float:
    try:
        return float(environ.get("BOARD_LLAMA_BACKSTOP_S", BACKSTOP_S))
    except ValueError:
        return BACKSTOP_S

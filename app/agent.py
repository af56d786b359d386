"""`board agent`: keeps the rules when nobody is looking (a systemd service, or `--once` from cron).

One enforcement pass:
- reconcile: servers whose processes are gone are marked crashed (their ports free up);
- booking end: servers whose booking has ended or was cancelled are stopped (SIGTERM, SIGKILL after 10 s);
- warn: servers whose booking ends within 10 minutes are logged, once per server per run of the loop.

Each pass is short; the loop sleeps `--interval` seconds between passes, survives errors in a pass
(logged, then retried next time) and exits cleanly on SIGTERM. Run it as root so that it can stop
anyone's server; as an ordinary user it marks others' servers `stopping` and their supervisors
stop them.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime

DEFAULT_INTERVAL_S = 30.0


def _log(message: str) -> None:
    from app.core.text import inert

    stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} {inert(message, 500)}", flush=True)


def enforce_once(service, warned: set[int] | None = None, log: Callable[[str], None] = _log) -> dict[str, list]:
    """One pass over the servers; returns what it did (for tests and --json)."""
    done: dict[str, list] = {"crashed": [], "stopped": [], "warned": []}
    for server in service.reconcile():
        done["crashed" if server.state == "crashed" else "stopped"].append(server.id)
        log(f"server {server.id} ({server.user}, port {server.port}): processes gone; marked {server.state}")
    for server in service.enforce_booking_end():
        done["stopped"].append(server.id)
        log(f"server {server.id} ({server.user}, port {server.port}): booking {server.booking_id} ended;"
            f" {server.state}" + (f" ({server.exit_text})" if server.exit_text else ""))
    for server, left in service.ending_soon():
        if warned is not None and server.id in warned:
            continue
        if warned is not None:
            warned.add(server.id)
        done["warned"].append(server.id)
        log(f"warning: server {server.id} ({server.user}, port {server.port}) stops in {max(1, (left + 59) // 60)} min,"
            f" when booking {server.booking_id} ends")
    return done


def cmd_agent(session) -> int:
    from app.errors import BadInput, BoardError
    from app.llama.service import ServerService

    args = session.args
    if args.interval <= 0:
        raise BadInput("--interval must be more than 0 seconds")
    service = ServerService(session.conn, session.me, session.config)
    if args.once:
        as_json = getattr(args, "json", False)
        done = enforce_once(service, log=(lambda m: print(m, file=sys.stderr)) if as_json else _log)
        if as_json:
            from app.output import print_json

            print_json(done)
        return 0

    stopping = threading.Event()

    def on_term(signum, frame) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_term)
    _log(f"board agent: every {args.interval:g} s on {session.config.db_path} as {session.me.name}")
    warned: set[int] = set()
    while not stopping.is_set():
        started = time.monotonic()
        try:
            enforce_once(service, warned)
        except BoardError as error:
            _log(f"pass failed: {error}")
        except Exception as error:  # noqa: BLE001 - a service must outlive one bad pass
            _log(f"pass failed: {type(error).__name__}: {error}")
        stopping.wait(max(0.0, args.interval - (time.monotonic() - started)))
    _log("board agent: stopped")
    sys.stdout.flush()
    return 0

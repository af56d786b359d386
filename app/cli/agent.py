"""`board agent`, `board doctor`, `board backup`, `board migrate`: running and looking after the board itself.

`board agent` is the board service where the config names its socket (app.service.door.server). On a
database file one user owns it only keeps the rules when nobody is looking (a systemd service, or
`--once` from cron), one enforcement pass at a time:
- reconcile: servers whose processes are gone are marked crashed (their ports free up);
- booking end: servers whose booking has ended or was cancelled are stopped (SIGTERM, SIGKILL after 10 s);
- warn: servers whose booking ends within 10 minutes are logged, once per server per run of the loop.

Each pass is short; the loop sleeps `--interval` seconds between passes, survives errors in a pass
(logged, then retried next time) and exits cleanly on SIGTERM. Run it as root so that it can stop
anyone's server; as an ordinary user it marks others' servers `stopping` and their supervisors
stop them.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from app.cli.arguments import daemon
from app.errors import BadInput, BoardError
from app.output import EXIT_OK, EXIT_UNEXPECTED, print_json

DEFAULT_INTERVAL_S = 30.0


def cmd_agent(ctx) -> int:
    from app.cli.logs import start_logging  # start-up: only the daemons load logging

    socket_path = ctx.config.service.socket
    if socket_path and ctx.args.once:  # root's cron on the shared config would enforce the service's file
        raise BadInput("board agent --once enforces a database file you own; this config names the board service"
                       " ([service] socket), which enforces its own database: systemctl status board-agent")
    start_logging(ctx.environ, limit=500)
    if not socket_path:
        return enforce_file(ctx)  # a database one user owns: enforcement only
    if os.geteuid() == 0:
        raise BoardError("the board service does not run as root; run it as the system user board:"
                         " systemctl start board-agent, or setpriv --reuid board --regid board --init-groups"
                         " --inh-caps +kill --ambient-caps +kill board agent")
    from app.llama.catalog import check_catalog
    from app.service import open_service
    from app.service.box.files import secure_state
    from app.service.door.server import log, run_agent

    service = open_service(ctx.config, demo=ctx.demo, environ=ctx.environ, transport="socket")
    if ctx.config.models and (bad := check_catalog(ctx.config, service.fleet.latest().cards)):
        service.fleet.close()
        for line in bad:  # each bad entry, before anything is opened or served
            print(f"board: bad config {ctx.config.path}: {line}", file=sys.stderr)
        return 2
    os.umask(0o077)  # the database, its -wal and -shm are the service's alone
    for change in secure_state(ctx.config.db_path):
        log.warning(f"board agent: {change}")
    service.conn  # noqa: B018 - opens and migrates the database now, with a clear error if it can't
    return run_agent(service, socket_path)


# -- the agent on a database file one user owns ---------------------------------------------------


def enforce_once(service, warned: set[int] | None = None) -> dict[str, list]:
    """One pass over the servers; returns what it did (for tests and --json)."""
    import logging  # start-up: only the daemons load logging

    log = logging.getLogger(__name__)
    done: dict[str, list] = {"crashed": [], "stopped": [], "warned": []}
    for server in service.reconcile():
        done["crashed" if server.state == "crashed" else "stopped"].append(server.id)
        log.warning(f"server {server.id} ({server.user}, port {server.port}): processes gone; marked {server.state}")
    for server in service.enforce_booking_end():
        done["stopped"].append(server.id)
        log.info(f"server {server.id} ({server.user}, port {server.port}): booking {server.booking_id} ended;"
                 f" {server.state}" + (f" ({server.exit_text})" if server.exit_text else ""))
    for server, left in service.ending_soon():
        if warned is not None and server.id in warned:
            continue
        if warned is not None:
            warned.add(server.id)
        done["warned"].append(server.id)
        log.warning(f"warning: server {server.id} ({server.user}, port {server.port}) stops in"
                    f" {max(1, (left + 59) // 60)} min, when booking {server.booking_id} ends")
    return done


def enforce_file(ctx) -> int:
    import logging  # start-up: only the daemons load logging

    from app.llama.service import ServerService

    args = ctx.args
    if args.interval <= 0:
        raise BadInput("--interval must be more than 0 seconds")
    service = ServerService(ctx.conn, ctx.me, ctx.config)
    if args.once:
        as_json = getattr(args, "json", False)
        done = enforce_once(service)  # what it did is logged (stderr): stdout is the JSON alone
        if as_json:
            print_json(done)
        return 0

    stopping = threading.Event()

    def on_term(signum, frame) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_term)
    log = logging.getLogger(__name__)
    log.info(f"board agent: every {args.interval:g} s on {ctx.config.db_path} as {ctx.me.name}")
    warned: set[int] = set()
    while not stopping.is_set():
        started = time.monotonic()
        try:
            enforce_once(service, warned)
        except BoardError as error:
            log.error(f"pass failed: {error}")
        except Exception as error:  # noqa: BLE001 - a service must outlive one bad pass
            log.error(f"pass failed: {type(error).__name__}: {error}")
        stopping.wait(max(0.0, args.interval - (time.monotonic() - started)))
    log.info("board agent: stopped")
    return 0


# -- doctor and backup ------------------------------------------------------------------------------


def cmd_doctor(ctx) -> int:
    from app.client.health import service_checks
    from app.store.setup import doctor

    config = ctx.config
    from app.cli.cards import hardware_checks

    service = service_checks(config)
    checks: Iterator[tuple[bool | None, str]] = service  # None: a warning
    if ctx.demo is not None:  # the demo runs in-process on a database of the member's own: no shared install here
        checks = iter([(True, f"the demo's database {config.db_path} is yours alone (board --demo): the shared"
                              " install's checks (its directory and files, the admin group, the service) do not apply")])
    elif config.storage_url and _checks_the_store(config):
        from app.store.pg_doctor import doctor as pg_doctor
        from app.store.setup import admin_group_check

        checks = pg_doctor(config.store, extra=itertools.chain([admin_group_check(config.admin_group)], service))
    elif not config.storage_url and (not config.service.socket or os.geteuid() == 0):
        # members cannot see the service's files, root can
        checks = doctor(config.db_path, config.admin_group, extra=service)
    problems = 0
    for ok, line in itertools.chain(checks, hardware_checks(ctx)):
        problems += ok is False
        print({True: "ok    ", False: "FIX   ", None: "WARN  "}[ok] + line)  # a warning does not fail doctor
    return EXIT_OK if problems == 0 else EXIT_UNEXPECTED


def _checks_the_store(config) -> bool:
    """Whether this user checks the PostgreSQL store: where there is no service, or as root, or as the service's user
    (who owns its socket or [storage] password_file); a member's own role, if any, is not the service's."""
    if not config.service.socket or os.geteuid() == 0:
        return True
    for path in (config.service.socket, config.storage_password_file):
        try:
            if path and os.stat(path).st_uid == os.geteuid():
                return True
        except OSError:
            continue
    return False


def cmd_backup(ctx) -> int:
    from app.history.backup import backup_history, check_history_target, history_target
    from app.store.backup import backup

    def progress(done: int, total: int) -> None:
        print(f"backup: {done}/{total} pages ({done * 100 // total}%)", flush=True)

    if ctx.config.storage_url:
        raise BadInput("the board's store is PostgreSQL ([storage] url): back it up with pg_dump (e.g. pg_dump -Fc"
                       " -f board.dump DBNAME), not board backup")
    source, target = ctx.config.db_path, Path(ctx.args.path)
    # The history is its own file: its copy goes beside the board's, and a name in its way is refused first.
    history, history_copy = ctx.config.history_path, history_target(target)
    if history.is_file():
        check_history_target(history, history_copy, force=ctx.args.force)
    result = backup(source, target, force=ctx.args.force, progress=progress)
    print(result.summary(source))
    copied = backup_history(history, history_copy, force=ctx.args.force)
    print(copied.summary(history) if copied else f"no history at {history} (the service has not sampled): nothing more to copy")
    return EXIT_OK


def cmd_migrate(ctx) -> int:
    from app.config import PostgresStore
    from app.errors import Conflict
    from app.migrate import check_url, make_schema, migrate

    config, args = ctx.config, ctx.args
    check_url(args.to)  # a bad URL: one line, exit 2, before anything is opened
    password_file = Path(args.password_file).expanduser() if args.password_file else None
    target = PostgresStore(args.to, password_file, config.fleet_host)
    if args.schema_only:
        from app.store.pg_schema import PG_LATEST

        print(f"the board's schema in {make_schema(target)} is at version {PG_LATEST}")
        return EXIT_OK
    if config.service.socket and _answers(config.service.socket):
        raise Conflict(f"the board service is running on {config.service.socket}: stop it first (systemctl stop"
                       " board-agent), so that nothing is written after the copy; nothing was copied")

    def progress(table: str, rows: int) -> None:
        print(f"copied {rows:,} {table}", file=sys.stderr, flush=True)

    result = migrate(config.db_path, target, progress, history=config.history_path)
    print(result.summary(config.db_path))
    if result.first_broken_event is not None:
        raise BoardError(f"copied, but the audit chain was already broken at event {result.first_broken_event} in"
                         f" {config.db_path} (an edit by hand): compare it with a backup; board doctor on the new"
                         " store shows the same")
    print("next: set [storage] url to this database in each host's config (docs/fleet.md), then start the service")
    return EXIT_OK


def _answers(path: str) -> bool:
    """Whether something accepts connections on the Unix socket at `path` (a service we cannot reach: no)."""
    import socket  # start-up: only board migrate asks

    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(5)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


# -- the parser: app.cli.build_parser calls these in the order `board --help` lists them --------------


def add_backup(command) -> None:
    p = command("backup", cmd_backup, "copy the live database to PATH (and its history beside it: b.db, b.history.db),"
                " consistent while others write (SQLite online backup)")
    p.add_argument("path", help="the new file; an existing one is replaced only with --force")
    p.add_argument("--force", action="store_true", help="replace PATH if it exists")


def add_migrate(command) -> None:
    p = command("migrate", cmd_migrate, "copy this install's SQLite database into an empty PostgreSQL database (one"
                " transaction, ids kept), then check the row counts and the audit chain there")
    p.add_argument("--to", required=True, metavar="URL", help="the target, a libpq URI: postgresql://ROLE@HOST/DBNAME")
    p.add_argument("--password-file", metavar="PATH", help="the role's password, in a file of your own (mode 0600)")
    p.add_argument("--schema-only", action="store_true", help="make or upgrade the board's tables there, as their"
                   " owner, copying nothing (a new fleet; after an upgrade of board)")


def add_doctor(command) -> None:
    command("doctor", cmd_doctor, "check the database (one owner, 0700/0600, no links, audit chain), the service, and the"
            " box: driver and CUDA for the cards, the llama-server build, PCIe links")


def add_agent(command) -> None:
    p = daemon(command("agent", cmd_agent, "enforce the rules: stop servers whose booking ended (a service; --once for"
                       " cron)", json_flag=True))
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, help="seconds between passes (default 30)")

"""The `board` command: quick subcommands for the shell, and the TUI when run with no subcommand.

Only `board` with no subcommand imports Textual; everything else stays on the fast path.
Exit codes: 0 ok, 1 unexpected, 2 bad input or not found, 3 conflict, 4 not permitted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from app.errors import BadInput, BoardError, NotPermitted

EXIT_OK, EXIT_UNEXPECTED, EXIT_BAD_INPUT, EXIT_CONFLICT, EXIT_NOT_PERMITTED = 0, 1, 2, 3, 4

EPILOG = """\
times: now, 14:00, tomorrow 9:00, mon 9:00, 2026-12-01T14:00, +2h; ranges: 'tomorrow 9-19'
durations: 90m, 3h, 1h30m, 2d
exit codes: 0 ok, 1 unexpected, 2 bad input or not found, 3 conflict, 4 not permitted
"""


class Session:
    """What a command needs, each piece opened only when first used."""

    def __init__(self, args: argparse.Namespace, environ=os.environ):
        self.args, self.environ = args, environ

    @cached_property
    def demo(self) -> bool | str | None:
        """A scenario path, True for the default simulated fleet, or None to let BOARD_SIMULATE decide."""
        return getattr(self.args, "scenario", None) or getattr(self.args, "demo", False) or None

    @cached_property
    def config(self):
        from app.config import ConfigError, load_config

        db = getattr(self.args, "db", None)
        if db is None and self.demo is not None and not self.environ.get("BOARD_DB"):
            from app.demo import demo_db_path

            db = demo_db_path(self.environ)
        try:
            return load_config(db, self.environ)
        except ConfigError as error:
            raise BadInput(str(error)) from None

    @cached_property
    def client(self):
        """The one door to the service: its socket where the config names one, else the service in this process."""
        from app.client import open_client

        explicit_db = getattr(self.args, "db", None) is not None or bool(self.environ.get("BOARD_DB"))
        return open_client(self.config, demo=self.demo, explicit_db=explicit_db, environ=self.environ)

    @property
    def shared(self) -> bool:
        """True when this command goes through the shared service's socket."""
        return self.client.transport == "socket"

    @cached_property
    def me(self):
        from app.core.identity import current_identity

        return current_identity(self.config.admin_group)

    @cached_property
    def conn(self):
        from app.store.db import connect

        conn = connect(self.config.db_path)
        if self.demo is not None:
            from app.demo import seed_if_empty

            seed_if_empty(conn, self.snapshot.cards)
        return conn

    @cached_property
    def source(self):
        from app.gpu import NoDriverError, open_source

        try:
            return open_source(self.demo, environ=self.environ)
        except NoDriverError as error:
            raise BoardError(str(error)) from None
        except ValueError as error:  # a bad scenario file
            raise BadInput(str(error)) from None

    @cached_property
    def snapshot(self):
        return self.source.read()

    @cached_property
    def service(self):
        from app.core.bookings import BookingService

        return BookingService(self.conn, self.me, self.config, self.snapshot.cards, self.snapshot.topology)

    def now(self) -> datetime:
        return datetime.now().astimezone()


# -- output ------------------------------------------------------------------------------------


def iso(epoch: int | float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


def _booking_json(data: dict | None) -> dict[str, Any] | None:
    from app.model import booking_from_wire

    return None if data is None else booking_json(booking_from_wire(data))


def booking_json(booking) -> dict[str, Any] | None:
    if booking is None:
        return None
    return {
        "id": booking.id,
        "user": booking.user,
        "cards": list(booking.cards),
        "card_uuids": list(booking.card_uuids),
        "start": iso(booking.start),
        "end": iso(booking.end),
        "class": booking.klass,
        "note": booking.note,
        "status": booking.status,
    }


def print_json(value: Any) -> None:
    # ensure_ascii keeps other users' text inert on any terminal.
    print(json.dumps(value, indent=2))


def booking_line(booking) -> str:
    from app.core.text import format_cards, format_time, inert

    state = "" if booking.status == "booked" else f" [{booking.status}]"
    note = f"  {inert(booking.note, 60)}" if booking.note else ""
    return (
        f"#{booking.id:<5} {inert(booking.user, 16):<16} cards {format_cards(booking.cards):<15}"
        f" {format_time(booking.start)} → {format_time(booking.end)}  {booking.klass}{state}{note}"
    )


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


# -- time arguments ----------------------------------------------------------------------------


def parse_span(session: Session, start_text: str, for_text: str | None, until_text: str | None) -> tuple[int, int]:
    """--start (a time or a range) with --for or --until, as UTC epoch seconds."""
    from app.core.timeparse import TimeInputError, parse_duration, parse_when, parse_when_or_range

    now = session.now()
    try:
        start, range_end = parse_when_or_range(start_text, now)
        if for_text is not None:
            end = start + parse_duration(for_text)
        elif until_text is not None:
            end = parse_when(until_text, start)
        elif range_end is not None:
            end = range_end
        else:
            raise BadInput("say how long: --for 3h, --until 18:00, or a range such as --start 'tomorrow 9-19'")
    except TimeInputError as error:
        raise BadInput(str(error)) from None
    except OverflowError:
        raise BadInput("that time is out of range") from None
    return int(start.timestamp()), int(end.timestamp())


def parse_cards(text: str) -> list[int]:
    from app.core.parse import parse_cards as parse  # one grammar for the CLI and the TUI: 0,1 and 4-7

    return parse(text)


# -- commands ----------------------------------------------------------------------------------


def cmd_status(session: Session) -> int:
    from app.core.text import format_time, inert

    found, now = session.client.call("status"), time.time()
    if session.args.json:
        print_json({
            "simulated": found["simulated"],
            "taken_at": iso(found["taken_at"]),
            "cards": [_card_json(card) for card in found["cards"]],
        })
        return EXIT_OK

    def num(value, fmt="{}"):
        return "n/a" if value is None else fmt.format(value)

    header = ["#", "STATE", "VRAM GiB", "UTIL", "TEMP", "POWER W", "HOLDER", "UNTIL", "NEXT", "USERS"]
    lines = [header]
    for c in found["cards"]:
        used, total = c["memory_used_mib"], c["memory_total_mib"]
        vram = "n/a" if used is None or not total else f"{used / 1024:.1f}/{total / 1024:.1f}"
        booking, upcoming = c["booking"], c["next_booking"]
        nxt = f"{inert(upcoming['user'], 12)} {format_time(upcoming['start'], now)}" if upcoming else "-"
        lines.append([
            str(c["index"]), " ".join([c["state"], *c["warnings"]]), vram, num(c["utilization_pct"], "{}%"),
            num(c["temperature_c"], "{}°C"), f"{num(c['power_w'], '{:.0f}')}/{num(c['power_limit_w'], '{:.0f}')}",
            inert(booking["user"], 12) if booking else "-",
            format_time(booking["end"], now) if booking else "-",
            nxt, inert(",".join(c["users"]), 30) or "-",
        ])
    names = {c["name"] for c in found["cards"] if c["name"]}
    badge = " · SIMULATED" if found["simulated"] else ""
    print(f"{len(found['cards'])} × {', '.join(sorted(names)) or 'GPU'}{badge}")
    print(table(lines))
    return EXIT_OK


def _card_json(card: dict[str, Any]) -> dict[str, Any]:
    from app.core.cardstate import UNKNOWN_USER

    shown = {k: v for k, v in card.items() if k != "users"}
    shown["booking"] = _booking_json(card["booking"])
    shown["next_booking"] = _booking_json(card["next_booking"])
    shown["processes"] = [{**p, "user": p["user"] or UNKNOWN_USER} for p in card["processes"]]
    return shown


def cmd_book(session: Session) -> int:
    args = session.args
    if args.count is None and args.cards is None:
        raise BadInput("say which cards: a count (board book 2) or --cards 0,1")
    if args.count is not None and args.cards is not None:
        raise BadInput("give a count or --cards, not both")
    start, end = parse_span(session, args.start, args.duration, args.until)
    booking = session.client.call(
        "book",
        cards=parse_cards(args.cards) if args.cards is not None else None,
        count=args.count,
        start=start,
        end=end,
        note=args.note,
        **{"class": args.klass},
    )
    _print_booking(session, booking, "booked")
    return EXIT_OK


def _print_booking(session: Session, data: dict, verb: str) -> None:
    from app.model import booking_from_wire

    booking = booking_from_wire(data)
    if session.args.json:
        print_json(booking_json(booking))
    else:
        print(f"{verb} {booking_line(booking)}")


def cmd_list(session: Session) -> int:
    from app.core.timeparse import TimeInputError, parse_when
    from app.model import booking_from_wire

    args, now = session.args, session.now()
    try:
        start = int(parse_when(args.from_, now).timestamp()) if args.from_ else (None if args.all else int(now.timestamp()))
        end = int(parse_when(args.to, now).timestamp()) if args.to else None
    except TimeInputError as error:
        raise BadInput(str(error)) from None
    found = [booking_from_wire(b) for b in session.client.call(
        "list", start=start, end=end, user=args.user, mine=args.mine, include_cancelled=args.all)]
    if args.json:
        print_json({"bookings": [booking_json(b) for b in found]})
    elif not found:
        print("no bookings" + ("" if args.all else " from now on; --all shows past and cancelled ones"))
    else:
        print("\n".join(booking_line(b) for b in found))
    return EXIT_OK


def cmd_cancel(session: Session) -> int:
    _print_booking(session, session.client.call("cancel", id=session.args.id), "cancelled")
    return EXIT_OK


def cmd_release(session: Session) -> int:
    _print_booking(session, session.client.call("release", id=session.args.id), "released")
    return EXIT_OK


def cmd_extend(session: Session) -> int:
    args = session.args
    from app.core.timeparse import TimeInputError, parse_duration, parse_when

    try:
        if args.duration is not None:
            change = {"add_seconds": int(parse_duration(args.duration).total_seconds())}
        else:
            change = {"end": int(parse_when(args.until, session.now()).timestamp())}
    except TimeInputError as error:
        raise BadInput(str(error)) from None
    _print_booking(session, session.client.call("extend", id=args.id, **change), "extended")
    return EXIT_OK


def cmd_reassign(session: Session) -> int:
    args = session.args
    cards = parse_cards(args.cards) if args.cards is not None else None
    _print_booking(session, session.client.call("reassign", id=args.id, cards=cards, user=args.user,
                                                force=args.force), "reassigned")
    return EXIT_OK


def cmd_admin(session: Session) -> int:
    raise BadInput("say which admin action: board admin reassign ID (--cards 4,5 | --user NAME)")


def cmd_run(session: Session) -> int:
    """Exec the command on the booked cards. Through the service, this process first registers for the
    booking, and the registration's socket stays open in the job: the service stops it when the booking ends."""
    from app.model import booking_from_wire

    args = session.args
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise BadInput("give a command to run: board run -- python train.py")
    client = session.client
    if client.transport == "socket":
        sock, _, result = client.stream("register", {"kind": "job", "booking": args.booking})
        os.set_inheritable(sock.fileno(), True)
        booking = booking_from_wire(result["booking"])
    else:
        booking = booking_from_wire(client.call("run", booking=args.booking))
    uuids = ",".join(booking.card_uuids)
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=uuids, NVIDIA_VISIBLE_DEVICES=uuids,
               BOARD_BOOKING_ID=str(booking.id), BOARD_BOOKING_END=iso(booking.end))
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        raise BadInput(f"command not found: {command[0]}") from None
    except PermissionError:
        raise NotPermitted(f"can't execute {command[0]}: permission denied") from None
    return EXIT_UNEXPECTED  # not reached


def cmd_log(session: Session) -> int:
    from app.core.text import format_time, inert

    found = session.client.call("log", limit=session.args.limit, booking=session.args.booking)
    if session.args.json:
        print_json({"events": [{**{k: v for k, v in e.items() if k != "ts"}, "time": iso(e["ts"])} for e in found]})
        return EXIT_OK
    for e in reversed(found):
        outcome = "ok" if e["ok"] else f"REFUSED: {inert(str(e['details'].get('refused', '')), 100)}"
        booking = f" #{e['booking_id']}" if e["booking_id"] is not None else ""
        print(f"{format_time(e['ts'])}  {inert(e['actor'], 16):<16} {e['action']}{booking}  {outcome}")
    return EXIT_OK


def cmd_whoami(session: Session) -> int:
    me = session.client.call("whoami")
    if session.args.json:
        print_json(me)
    else:
        role = "admin" if me["admin"] else "member"
        where = f"database {me['db']}" if me["db"] else f"the board service at {session.config.service.socket}"
        print(f"{me['user']} (uid {me['uid']}), {role}; {where}")
    return EXIT_OK


def cmd_init(session: Session) -> int:
    from app.store.setup import init_shared

    directory = Path(session.args.dir) if session.args.dir else session.config.db_path.parent
    db_path = directory / session.config.db_path.name
    for line in init_shared(db_path, session.args.group):
        print(line)
    return EXIT_OK


def cmd_doctor(session: Session) -> int:
    from app.service.health import service_checks
    from app.store.setup import doctor

    config = session.config
    checks = service_checks(config)
    if not config.service.socket or os.geteuid() == 0:  # members cannot see the service's files, root can
        checks = doctor(config.db_path, config.admin_group, group=session.args.group, extra=checks)
    problems = 0
    for ok, line in checks:
        problems += not ok
        print(("ok    " if ok else "FIX   ") + line)
    return EXIT_OK if problems == 0 else EXIT_UNEXPECTED


def cmd_agent(session: Session) -> int:
    socket_path = session.config.service.socket
    if not socket_path or session.args.once:
        from app.agent import cmd_agent as enforce_file  # a database one user owns: enforcement only

        return enforce_file(session)
    if os.geteuid() == 0:
        raise BoardError("the board service does not run as root; run it as the system user board:"
                         " systemctl start board-agent, or setpriv --reuid board --regid board --init-groups"
                         " --inh-caps +kill --ambient-caps +kill board agent")
    from app.service import open_service
    from app.service.files import secure_state
    from app.service.server import log, run_agent

    os.umask(0o077)  # the database, its -wal and -shm are the service's alone
    for change in secure_state(session.config.db_path):
        log(f"board agent: {change}")
    service = open_service(session.config, demo=session.demo, environ=session.environ, transport="socket")
    service.conn  # opens and migrates the database now, with a clear error if it can't
    return run_agent(service, socket_path)


def cmd_backup(session: Session) -> int:
    from app.store.backup import backup

    def progress(done: int, total: int) -> None:
        print(f"backup: {done}/{total} pages ({done * 100 // total}%)", flush=True)

    source = session.config.db_path
    result = backup(source, Path(session.args.path), force=session.args.force, progress=progress)
    print(result.summary(source))
    return EXIT_OK


def cmd_board(session: Session) -> int:
    from app.tui.app import run_board  # the one command that loads Textual

    return run_board(session)


# -- parser ------------------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        from app.core.text import inert  # argparse echoes stray arguments verbatim: keep them one inert line

        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {inert(message, 300)}; see '{self.prog} --help'\n")


def booking_id(text: str) -> int:
    """A booking id argument: ASCII digits in 1..2**63-1; anything else is bad input, not an SQLite overflow."""
    from app.core.parse import parse_id

    try:
        return parse_id(text)
    except BadInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def card_count(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 4):
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a number of cards; give 1, 2, 4 or 8")
    return int(text)


def event_limit(text: str) -> int:
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 7 else 0
    if not 0 < value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a count from 1 to 1000000")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, help="the database file (else BOARD_DB, the config, /var/lib/board/board.db)")
    common.add_argument("--demo", action="store_true", default=argparse.SUPPRESS,
                        help="use the simulated fleet and a demo database in ~/.local/state/board")
    common.add_argument("--scenario", metavar="TOML", default=argparse.SUPPRESS,
                        help="a simulated fleet scenario file (implies --demo)")
    parser = Parser(prog="board", description="The GPU occupancy board: see the cards, book them, run on them. Without a command it opens the board.",
                    epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common])
    # Not db/demo/scenario: set_defaults would change the option objects that the subcommands share.
    parser.set_defaults(handler=cmd_board, json=False)
    from app import __version__

    parser.add_argument("--version", action="version", version=f"board {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, handler, help: str, json_flag: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[common], epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(handler=handler)
        if json_flag:
            p.add_argument("--json", action="store_true", help="print JSON")
        return p

    command("status", cmd_status, "every card: telemetry, state, current and next booking", json_flag=True)

    p = command("book", cmd_book, "book cards for a time slot", json_flag=True)
    p.add_argument("count", nargs="?", type=card_count, help="how many cards (1, 2, 4 or 8); picks the best-connected free set")
    p.add_argument("--cards", help="exact cards, e.g. 0,1")
    p.add_argument("--start", default="now", help="when it starts, or a range such as 'tomorrow 9-19' (default now)")
    span = p.add_mutually_exclusive_group()
    span.add_argument("--for", dest="duration", metavar="DUR", help="how long, e.g. 3h")
    span.add_argument("--until", metavar="WHEN", help="when it ends")
    p.add_argument("--class", dest="klass", metavar="CLASS", default="experiment", help="online, batch, finetune or experiment (default)")
    p.add_argument("--note", default="", help="what it is for")

    p = command("list", cmd_list, "bookings from now on (or a window)", json_flag=True)
    who = p.add_mutually_exclusive_group()
    who.add_argument("--mine", action="store_true", help="only mine")
    who.add_argument("--user", help="only this user's")
    p.add_argument("--from", dest="from_", metavar="WHEN", help="window start (default now)")
    p.add_argument("--to", metavar="WHEN", help="window end")
    p.add_argument("--all", action="store_true", help="include past and cancelled bookings")

    for name, handler, help in (
        ("cancel", cmd_cancel, "cancel a booking (an active one ends now)"),
        ("release", cmd_release, "end an active booking now"),
    ):
        p = command(name, handler, help, json_flag=True)
        p.add_argument("id", type=booking_id, help="booking id")

    p = command("extend", cmd_extend, "make a booking longer, if the time after it is free", json_flag=True)
    p.add_argument("id", type=booking_id, help="booking id")
    span = p.add_mutually_exclusive_group(required=True)
    span.add_argument("--for", dest="duration", metavar="DUR", help="add this much time")
    span.add_argument("--until", metavar="WHEN", help="the new end")

    p = command("admin", cmd_admin, "admin actions")
    admin = p.add_subparsers(title="admin commands", metavar="ACTION")
    p = admin.add_parser("reassign", help="move a booking to other cards or another user", parents=[common])
    p.set_defaults(handler=cmd_reassign)
    p.add_argument("id", type=booking_id, help="booking id")
    p.add_argument("--json", action="store_true", help="print JSON")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--cards", help="the new cards, as many as before")
    target.add_argument("--user", help="the new holder")
    p.add_argument("--force", action="store_true", help="move it even while its servers or jobs run (they are stopped)")

    p = command("run", cmd_run, "run a command on your booked cards only")
    p.add_argument("--booking", type=booking_id, help="which of your active bookings (default: the only one)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    p = command("log", cmd_log, "the audit log", json_flag=True)
    p.add_argument("--limit", type=event_limit, default=50, help="how many events (default 50)")
    p.add_argument("--booking", type=booking_id, help="only this booking's events")

    command("whoami", cmd_whoami, "who board thinks you are, and your role", json_flag=True)

    p = command("init", cmd_init, "create the shared database directory (setgid, 2770) and file (0660); run as root")
    p.add_argument("--group", required=True, help="the Unix group of board users")
    p.add_argument("--dir", help="the directory (default: the configured database's)")

    p = command("backup", cmd_backup, "copy the live database to PATH, consistent while others write (SQLite online backup)")
    p.add_argument("path", help="the new file; an existing one is replaced only with --force")
    p.add_argument("--force", action="store_true", help="replace PATH if it exists")

    p = command("doctor", cmd_doctor, "check the database's permissions, filesystem and audit chain")
    p.add_argument("--group", help="the Unix group of board users, to check the directory and files against")

    from app.llama.cli import add_parsers as add_serve_parsers  # light: argparse only

    add_serve_parsers(sub, command, common, id_type=booking_id)

    p = command("agent", cmd_agent, "enforce the rules: stop servers whose booking ended (a service; --once for cron)",
                json_flag=True)
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between passes (default 30)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    for arg in argv:  # bytes that are not UTF-8 arrive as lone surrogates, which SQLite cannot store
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            print(f"board: the argument {arg[:60]!r} is not valid UTF-8; check the terminal's encoding (LANG)",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
    parser = build_parser()
    args = parser.parse_args(argv)
    session = Session(args)
    try:
        return args.handler(session)
    except BoardError as error:
        from app.core.text import inert  # messages can quote other users' text: one inert line

        print(f"board: {inert(str(error))}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as error:  # noqa: BLE001 - the last line of defence: no tracebacks for users
        if os.environ.get("BOARD_DEBUG"):
            raise
        from app.core.text import inert

        print(f"board: unexpected error: {type(error).__name__}: {inert(str(error), 300)};"
              " rerun with BOARD_DEBUG=1 for details", file=sys.stderr)
        return EXIT_UNEXPECTED

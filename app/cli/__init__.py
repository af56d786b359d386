"""The `board` command: quick subcommands for the shell, and the TUI when run with no subcommand.

Only `board` with no subcommand imports Textual; everything else stays on the fast path.
Exit codes: 0 ok, 1 unexpected, 2 bad input or not found, 3 conflict, 4 not permitted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from app.commands import (
    Context,
    check_arguments,
    run_command,
    cmd_book,
    cmd_cancel,
    cmd_ical,
    cmd_list,
    cmd_release,
    cmd_series,
    cmd_series_cancel,
    cmd_series_extend,
    cmd_series_show,
    cmd_status,
    cmd_whoami,
    parse_cards,
    say_notes,
)
from app.errors import BadInput, BoardError, NotPermitted
from app.output import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNEXPECTED, booking_json, iso, print_booking, print_json

EPILOG = """\
times: now, 14:00, tomorrow 9:00, mon 9:00, tonight, this weekend, 2026-12-01T14:00, +2h; ranges: 'tomorrow 9-19'
--until: day words read from now as in --start; a bare 18:00 is the first 18:00 after the start, +2h is after the start
  (for extend: after the current end)
cards: 0,1 or 4-7 or 0-1,4;  durations: 90m, 3h, 1h30m, 2d
exit codes: 0 ok, 1 unexpected, 2 bad input or not found, 3 conflict, 4 not permitted
"""


def cmd_extend(ctx: Context) -> int:
    """--until reads as in `book`, with the booking's current end as the start: 20:00 is the first 20:00 after it."""
    args = ctx.args
    from datetime import datetime

    from app.core.timeparse import TimeInputError, parse_duration, parse_end

    try:
        if args.duration is not None:
            change = {"add_seconds": int(parse_duration(args.duration).total_seconds())}
        else:
            current = datetime.fromtimestamp(ctx.client.call("get", id=args.id)["end"]).astimezone()
            notes: list[str] = []
            end = parse_end(args.until, current, ctx.now(), night_start=ctx.night_start, after="the current end",
                            notes=notes)
            say_notes(notes)
            change = {"end": int(end.timestamp())}
    except TimeInputError as error:
        raise BadInput(str(error)) from None
    print_booking(ctx.client.call("extend", id=args.id, **change), "extended", args.json)
    return EXIT_OK


def cmd_reassign(ctx: Context) -> int:
    args = ctx.args
    cards = parse_cards(args.cards) if args.cards is not None else None
    print_booking(ctx.client.call("reassign", id=args.id, cards=cards, user=args.user, force=args.force),
                  "reassigned", args.json)
    return EXIT_OK


def cmd_move(ctx: Context) -> int:
    """--start and --for/--until read as in `book`; the cards stay."""
    args = ctx.args
    from app.core.parse import parse_span

    notes: list[str] = []
    start, end = parse_span(args.start, args.duration, args.until, ctx.now(), night_start=ctx.night_start,
                            how_long="say how long: --for 3h or --until 18:00", notes=notes)
    say_notes(notes)
    moved = ctx.client.call("move", id=args.id, start=start, end=end,
                            **({"override_policy": True} if args.override_policy else {}))
    print_booking(moved, "moved", args.json)
    return EXIT_OK


def cmd_admin(ctx: Context) -> int:
    raise BadInput("say which admin action: board admin reassign ID (--cards 4,5 | --user NAME),"
                   " or board admin move ID --start WHEN (--for DUR | --until WHEN)")


def cmd_wait(ctx: Context) -> int:
    """Block until the booking starts, then print its cards (a move by the backfill or an admin is followed)."""
    from app.client.wait import wait_for_start

    booking = wait_for_start(ctx.client, ctx.args.id, timeout=ctx.args.timeout)
    if ctx.args.json:
        print_json(booking_json(booking))
    else:
        print(",".join(str(c) for c in booking["cards"]))
    return EXIT_OK


def cmd_run(ctx: Context) -> int:
    """Exec the command on the booked cards. Through the service, this process first registers for the
    booking, and the registration's socket stays open in the job: the service stops it when the booking ends."""
    args = ctx.args
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise BadInput("give a command to run: board run -- python train.py")
    client = ctx.client
    if args.wait:
        if args.booking is None:
            raise BadInput("--wait needs the booking to wait for: board run --booking ID --wait -- CMD")
        from app.client.wait import wait_for_start

        client.call("run", booking=args.booking, waiting=True)  # someone else's booking is refused now, not at its start
        wait_for_start(client, args.booking)
    if client.transport == "socket":
        sock, _, result = client.stream("register", {"kind": "job", "booking": args.booking})
        os.set_inheritable(sock.fileno(), True)
        booking = result["booking"]
    else:
        booking = client.call("run", booking=args.booking)
    uuids = ",".join(booking["card_uuids"])
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=uuids, NVIDIA_VISIBLE_DEVICES=uuids,
               BOARD_BOOKING_ID=str(booking["id"]), BOARD_BOOKING_END=iso(booking["end"]))
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        raise BadInput(f"command not found: {command[0]}") from None
    except PermissionError:
        raise NotPermitted(f"can't execute {command[0]}: permission denied") from None
    return EXIT_UNEXPECTED  # not reached


def cmd_log(ctx: Context) -> int:
    from app.core.text import format_time, inert

    found = ctx.client.call("log", limit=ctx.args.limit, booking=ctx.args.booking)
    if ctx.args.json:
        print_json({"events": [{**{k: v for k, v in e.items() if k != "ts"}, "time": iso(e["ts"])} for e in found]})
        return EXIT_OK
    for e in reversed(found):
        outcome = "ok" if e["ok"] else f"REFUSED: {inert(str(e['details'].get('refused', '')), 100)}"
        booking = f" #{e['booking_id']}" if e["booking_id"] is not None else ""
        print(f"{format_time(e['ts'])}  {inert(e['actor'], 16):<16} {e['action']}{booking}  {outcome}")
    return EXIT_OK


def cmd_doctor(ctx: Context) -> int:
    from app.client.health import service_checks
    from app.store.setup import doctor

    config = ctx.config
    checks = service_checks(config)
    if not config.service.socket or os.geteuid() == 0:  # members cannot see the service's files, root can
        checks = doctor(config.db_path, config.admin_group, extra=checks)
    problems = 0
    for ok, line in checks:
        problems += not ok
        print(("ok    " if ok else "FIX   ") + line)
    return EXIT_OK if problems == 0 else EXIT_UNEXPECTED


def cmd_agent(ctx: Context) -> int:
    socket_path = ctx.config.service.socket
    if socket_path and ctx.args.once:  # root's cron on the shared config would enforce the service's file
        raise BadInput("board agent --once enforces a database file you own; this config names the board service"
                       " ([service] socket), which enforces its own database: systemctl status board-agent")
    if not socket_path:
        from app.agent import cmd_agent as enforce_file  # a database one user owns: enforcement only

        return enforce_file(ctx)
    if os.geteuid() == 0:
        raise BoardError("the board service does not run as root; run it as the system user board:"
                         " systemctl start board-agent, or setpriv --reuid board --regid board --init-groups"
                         " --inh-caps +kill --ambient-caps +kill board agent")
    from app.service import open_service
    from app.service.files import secure_state
    from app.service.server import log, run_agent

    os.umask(0o077)  # the database, its -wal and -shm are the service's alone
    for change in secure_state(ctx.config.db_path):
        log(f"board agent: {change}")
    service = open_service(ctx.config, demo=ctx.demo, environ=ctx.environ, transport="socket")
    service.conn  # noqa: B018 - opens and migrates the database now, with a clear error if it can't
    return run_agent(service, socket_path)


def cmd_backup(ctx: Context) -> int:
    from app.history.backup import backup_history, check_history_target, history_target
    from app.store.backup import backup

    def progress(done: int, total: int) -> None:
        print(f"backup: {done}/{total} pages ({done * 100 // total}%)", flush=True)

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


def cmd_board(ctx: Context) -> int:
    from app.tui.app import run_board  # the one command that loads Textual

    return run_board(ctx)


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


def seconds(text: str) -> float:
    """A duration argument ('90m', '2h') in seconds."""
    from app.core.timeparse import TimeInputError, parse_duration

    try:
        return parse_duration(text).total_seconds()
    except TimeInputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def event_limit(text: str) -> int:
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 7 else 0
    if not 0 < value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a count from 1 to 1000000")
    return value


SERIES_HELP = """\
A standing slot: the same cards at the same times of day on each matching day from --from to --to
(inclusive), e.g. --cards 0-3 --class online --every weekday --start 9:00 --until 19:00 --to 2027-03-31.
Times are wall-clock in the service's policy zone ([policy] timezone), so 09:00 stays 09:00 across DST;
an --until at or before --start ends the next morning (--start 19:00 --until 7:00). Each occurrence is
a booking (linked by a series id) and passes every rule on its own, the policy's max_ahead_days
included: book what it allows and add the rest later with 'board series extend' (admins may pass
--override-policy, which is audited). Nothing is booked unless every occurrence is free, or with
--skip-conflicts; the conflicting ones are listed with their holder. 'board series' shows, cancels
(from now on) and extends a series; 'board cancel ID' cancels one occurrence."""


def add_series_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("standing slots (with --every)", SERIES_HELP)
    group.add_argument("--every", metavar="DAYS",
                       help="day, weekday, weekend, week (the weekday of --from) or days such as mon,wed,fri")
    group.add_argument("--from", dest="from_date", metavar="DATE", help="the first day: 2026-12-07, tomorrow, mon"
                                                                       " (default today)")
    group.add_argument("--to", dest="to_date", metavar="DATE", help="the last day (required with --every)")
    add_series_choices(group)


def add_series_choices(p) -> None:
    p.add_argument("--skip-conflicts", action="store_true",
                   help="book the free occurrences and list the conflicting ones (default: all or nothing)")
    p.add_argument("--override-policy", action="store_true",
                   help="admins: book occurrences the policy refuses; each override is audited")


def add_series_parser(command, common) -> None:
    """`board series show|cancel|extend SID`: a standing slot made with `board book --every`."""
    p = command("series", cmd_series, "standing slots made with 'book --every': show, cancel, extend")
    actions = p.add_subparsers(title="series commands", metavar="ACTION")
    for name, handler, help in (
        ("show", cmd_series_show, "the series' rule and every booking it made"),
        ("cancel", cmd_series_cancel, "cancel the occurrences that have not started (past ones stay as history,"
                                      " a running one stays)"),
        ("extend", cmd_series_extend, "move the last day later, booking the new occurrences all or nothing"),
    ):
        q = actions.add_parser(name, help=help, description=help, parents=[common])
        q.set_defaults(handler=handler)
        q.add_argument("id", type=series_id, help="series id (board list shows each booking's)")
        q.add_argument("--json", action="store_true", help="print JSON")
        if name == "extend":
            q.add_argument("--to", dest="to_date", metavar="DATE", required=True, help="the new last day")
            add_series_choices(q)


def series_id(text: str) -> int:
    from app.core.parse import parse_id

    try:
        return parse_id(text, "series")
    except BadInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS,
                        help="a database file you own (else BOARD_DB, the config, /var/lib/board/board.db)")
    common.add_argument("--demo", action="store_true", default=argparse.SUPPRESS,
                        help="use the simulated fleet and a demo database in ~/.local/state/board")
    common.add_argument("--scenario", metavar="TOML", default=argparse.SUPPRESS,
                        help="a simulated fleet scenario file (implies --demo)")
    parser = Parser(prog="board", description="The GPU occupancy board: see the cards, book them, run on them."
                                              " Without a command it opens the board.",
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
    p.add_argument("--cards", help="exact cards, e.g. 0,1 or 4-7 or 0-1,4")
    p.add_argument("--start", default="now", help="when it starts, or a range such as 'tomorrow 9-19' (default now)")
    span = p.add_mutually_exclusive_group()
    span.add_argument("--for", dest="duration", metavar="DUR", help="how long, e.g. 3h")
    span.add_argument("--until", metavar="WHEN",
                      help="when it ends: tomorrow 18:00; a bare 18:00 is the first after the start, +2h is after the start")
    p.add_argument("--class", dest="klass", metavar="CLASS", default="experiment",
                   help="online, batch, finetune or experiment (default)")
    p.add_argument("--note", default="", help="what it is for")
    later = p.add_mutually_exclusive_group()
    later.add_argument("--asap", action="store_true",
                       help="the earliest slot that fits, from now (or --start) on; it joins the queue and moves"
                            " up by itself when time frees earlier")
    later.add_argument("--or-later", action="store_true",
                       help="as --asap: start at --start or, if that is taken or refused, the earliest start after")
    from app.fit.cli import add_request_options

    p.add_argument("--model", metavar="M.gguf", help="size the booking from this model (with --ctx, --parallel): "
                                                       "picks the smallest group of cards that fits, and stores the request")
    add_request_options(p)
    add_series_options(p)

    p = command("list", cmd_list, "bookings from now on (or a window)", json_flag=True)
    who = p.add_mutually_exclusive_group()
    who.add_argument("--mine", action="store_true", help="only mine")
    who.add_argument("--user", help="only this user's")
    p.add_argument("--from", dest="from_", metavar="WHEN", help="window start (default now)")
    p.add_argument("--to", metavar="WHEN", help="window end")
    p.add_argument("--all", action="store_true", help="include past and cancelled bookings")

    p = command("ical", cmd_ical, "live bookings as an iCalendar file (RFC 5545) on stdout: board ical > board.ics")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--mine", action="store_true", help="only mine")
    who.add_argument("--user", help="only this user's")
    p.add_argument("--cards", help="only bookings that hold any of these cards, e.g. 0-3")
    p.add_argument("--all", action="store_true", help="no default window: past bookings too, and all ahead")
    p.add_argument("--from", dest="from_", metavar="WHEN", help="window start (default 7 days ago)")
    p.add_argument("--to", metavar="WHEN", help="window end (default 90 days after now, or after --from if later)")

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
    span.add_argument("--until", metavar="WHEN",
                      help="the new end: fri 18:00; a bare 20:00 is the first after the current end, +2h is after it")

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
    p = admin.add_parser("move", help="give a booking new times on the same cards; its holder is told",
                         parents=[common])
    p.set_defaults(handler=cmd_move)
    p.add_argument("id", type=booking_id, help="booking id")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--start", required=True, help="the new start, as in book (a started booking keeps its start)")
    span = p.add_mutually_exclusive_group(required=True)
    span.add_argument("--for", dest="duration", metavar="DUR", help="how long from the new start")
    span.add_argument("--until", metavar="WHEN", help="the new end, as in book")
    p.add_argument("--override-policy", action="store_true",
                   help="move it even where a pool rule or limit refuses (recorded in the audit log)")

    add_series_parser(command, common)

    p = command("run", cmd_run, "run a command on your booked cards only")
    p.add_argument("--booking", type=booking_id, help="which of your active bookings (default: the only one)")
    p.add_argument("--wait", action="store_true",
                   help="wait for the booking (--booking) to start, then run: a night job starts itself")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    p = command("wait", cmd_wait, "wait until a booking starts, then print its cards (exit 3 if it is cancelled)",
                json_flag=True)
    p.add_argument("id", type=booking_id, help="booking id")
    p.add_argument("--timeout", type=seconds, metavar="DUR", help="give up after this long (exit 3), e.g. 2h")

    p = command("log", cmd_log, "the audit log", json_flag=True)
    p.add_argument("--limit", type=event_limit, default=50, help="how many events (default 50)")
    p.add_argument("--booking", type=booking_id, help="only this booking's events")

    command("whoami", cmd_whoami, "who board thinks you are, and your role", json_flag=True)

    p = command("backup", cmd_backup, "copy the live database to PATH (and its history beside it: b.db, b.history.db),"
                " consistent while others write (SQLite online backup)")
    p.add_argument("path", help="the new file; an existing one is replaced only with --force")
    p.add_argument("--force", action="store_true", help="replace PATH if it exists")

    command("doctor", cmd_doctor, "check the database (one owner, 0700/0600, no links, audit chain) and the service")

    from app.llama.cli import add_parsers as add_serve_parsers  # light: argparse only

    add_serve_parsers(sub, command, common, id_type=booking_id)

    from app.fit.cli import add_parser as add_fit_parser

    add_fit_parser(command)

    from app.notify.cli import add_parser as add_notify_parser

    add_notify_parser(command, common)

    from app.faults.cli import add_parser as add_faults_parser

    add_faults_parser(command, seconds)

    from app.alerts.cli import add_parser as add_alerts_parser

    add_alerts_parser(command)

    from app.report.cli import add_parser as add_report_parser

    add_report_parser(command)

    p = command("agent", cmd_agent, "enforce the rules: stop servers whose booking ended (a service; --once for cron)",
                json_flag=True)
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between passes (default 30)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if (refusal := check_arguments(argv)) is not None:
        return refusal
    args = build_parser().parse_args(argv)
    return run_command(args.handler, Context(args))

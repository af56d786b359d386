"""The `board` command: the full parser, built from one module per command group, and `main`.

Where each command lives (its handler and its part of the parser):
  context.py    the command context (`ctx`), and running a handler: errors become one line and an exit code
  arguments.py  the parser class and the argument types several groups share
  status.py     status, whoami, log
  cards.py      cards, topo (the chassis table and the topology), and doctor's checks of the box
  power.py      power, power apply
  bookings.py   book (and book --every), list, ical, cancel, release, extend, wait, series
  admin.py      admin reassign, admin move
  run.py        run
  serve.py      serve start|stop|list|logs (llama-servers)
  fit.py        fit (and the request options of book --model)
  notify.py     notify test
  faults.py     faults
  alerts.py     alerts
  report.py     report
  monitoring.py monitoring dashboard|rules (the Grafana dashboard and Prometheus rules in app/monitoring)
  projects.py   projects (what each project has and spends)
  models.py     models (the team's catalog of models started on demand, and their state)
  agent.py      agent, doctor, backup, migrate
  gateway.py    key new|list|revoke, usage, gateway (the OpenAI-compatible front door)
  runner.py     runner (planned servers, as the system user board-llama)
  completion.py completion (the bash and zsh scripts), and the live words they ask for (`board __complete`)
Printing: app.output (bookings, status, series, tables); the rest in the group's module.

Only `board` with no subcommand imports Textual. app.quick parses the hot commands itself and runs
their handlers from status.py and bookings.py; importing those runs this file first, so it imports
nothing heavy at module level: argparse loads only when the full parser is built.
Exit codes: 0 ok, 1 unexpected, 2 bad input or not found, 3 conflict, 4 not permitted.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

EPILOG = """\
times: now, 14:00, tomorrow 9:00, mon 9:00, tonight, this weekend, 2026-12-01T14:00, +2h; ranges: 'tomorrow 9-19'
--until: day words read from now as in --start; a bare 18:00 is the first 18:00 after the start, +2h is after the start
  (for extend: after the current end)
cards: 0,1 or 4-7 or 0-1,4;  durations: 90m, 3h, 1h30m, 2d
exit codes: 0 ok, 1 unexpected, 2 bad input or not found, 3 conflict, 4 not permitted
docs: README.md and docs/ in the board source (every command and exit code: docs/commands.md)
"""


def cmd_board(ctx) -> int:
    from app.tui.app import run_board  # the one command that loads Textual

    return run_board(ctx)


def build_parser():
    import argparse

    from app.cli import (admin, agent, alerts, bookings, cards, completion, faults, fit, gateway, models, monitoring,
                         notify, power, projects, report, run, runner, serve, status)
    from app.cli.arguments import Parser

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

    # In the order `board --help` lists them.
    status.add_status(command)
    bookings.add_book(command)
    bookings.add_list(command)
    bookings.add_ical(command)
    bookings.add_cancel_release(command)
    bookings.add_extend(command)
    admin.add_parser(command, common)
    bookings.add_series(command, common)
    run.add_parser(command)
    bookings.add_wait(command)
    status.add_log(command)
    status.add_whoami(command)
    cards.add_parser(command)
    power.add_parser(command, common)
    agent.add_backup(command)
    agent.add_doctor(command)
    agent.add_migrate(command)
    serve.add_parser(command, common)
    fit.add_parser(command)
    notify.add_parser(command, common)
    faults.add_parser(command)
    alerts.add_parser(command)
    report.add_parser(command)
    monitoring.add_parser(command, common)
    projects.add_parser(command)
    models.add_parser(command)
    gateway.add_parser(command, common)
    agent.add_agent(command)
    runner.add_runner(command)
    completion.add_parser(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from app.cli.context import Context, check_arguments, run_command

    argv = sys.argv[1:] if argv is None else list(argv)
    if (refusal := check_arguments(argv)) is not None:
        return refusal
    if not argv:  # `board` alone opens the board: the parser of every command (a fifth of its start) is not needed
        from types import SimpleNamespace

        return run_command(cmd_board, Context(SimpleNamespace(handler=cmd_board, json=False)))
    args = build_parser().parse_args(argv)
    return run_command(args.handler, Context(args))

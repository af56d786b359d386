"""`board report [--since 30d] [--by user|class|pool|card] [--json | --csv]`."""

from __future__ import annotations

import argparse

from app.errors import BadInput
from app.output import EXIT_OK, print_json
DESCRIPTION = ("Booked GPU-hours against used ones, per user, class, pool or card, sorted by booked hours, with a"
               " totals row and a verdict on each seed threshold (utilisation, wait, VRAM, faults, heat). Used: the"
               " holder's processes and mean utilisation at [report] busy_util % or more (default 10).")


def _since(text: str) -> int:
    from app.report.compute import parse_since

    try:
        return parse_since(text)
    except BadInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_parser(command) -> None:
    p = command("report", cmd_report, "booked against used GPU-hours per user, class, pool or card, with verdicts")
    p.description = DESCRIPTION
    p.add_argument("--since", type=_since, default=30 * 86400, metavar="AGE",
                   help="how far back: 12h, 30d, 4w (default 30d, at most 400d)")
    p.add_argument("--by", choices=("user", "class", "pool", "card"), default="user", help="group by (default user)")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print JSON (its shape: docs/json.md)")
    form.add_argument("--csv", action="store_true", help="print CSV with a header")


def cmd_report(ctx) -> int:
    import sys

    from app.report.render import table, to_csv

    doc = ctx.client.call("report", since_s=ctx.args.since, by=ctx.args.by)
    if ctx.args.json:
        print_json(doc)
    elif ctx.args.csv:
        sys.stdout.write(to_csv(doc))
    else:
        print(table(doc))
    return EXIT_OK

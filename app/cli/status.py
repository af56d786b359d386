"""`board status`, `board whoami`, `board log`: what the board knows, read-only.

status and whoami are quick commands: app.quick runs their handlers without argparse, so this module
loads nothing heavy at the top; the parser's pieces load inside the add_* functions.
"""

from __future__ import annotations

import time

from app.output import EXIT_OK, iso, print_json, status_json, status_text


def cmd_status(ctx) -> int:
    found = ctx.client.call("status")
    if ctx.args.json:
        print_json(status_json(found))
    else:
        print(status_text(found, time.time()))
    return EXIT_OK


def cmd_whoami(ctx) -> int:
    me = ctx.client.call("whoami")
    if ctx.args.json:
        print_json(me)
    else:
        role = "admin" if me["admin"] else "member"
        where = f"database {me['db']}" if me["db"] else f"the board service at {getattr(ctx.client, 'path', '?')}"
        print(f"{me['user']} (uid {me['uid']}), {role}; {where}")
    return EXIT_OK


def cmd_log(ctx) -> int:
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


# -- the parser: app.cli.build_parser calls these in the order `board --help` lists them --------------


def add_status(command) -> None:
    command("status", cmd_status, "every card: telemetry, state, current and next booking", json_flag=True)


def add_log(command) -> None:
    from app.cli.arguments import booking_id, event_limit  # argparse: not on the quick path

    p = command("log", cmd_log, "the audit log", json_flag=True)
    p.add_argument("--limit", type=event_limit, default=50, help="how many events (default 50)")
    p.add_argument("--booking", type=booking_id, help="only this booking's events")


def add_whoami(command) -> None:
    command("whoami", cmd_whoami, "who board thinks you are, and your role", json_flag=True)

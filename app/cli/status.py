"""`board status [--short]`, `board whoami`, `board log`: what the board knows, read-only.

status and whoami are quick commands: app.quick runs their handlers without argparse, so this module
loads nothing heavy at the top; the parser's pieces load inside the add_* functions.
"""

from __future__ import annotations

import os
import sys
import time

from app.output import EXIT_OK, iso, many_hosts, print_json, stale_note, status_json, status_text


def cmd_status(ctx) -> int:
    found = ctx.client.call("status")
    if ctx.args.json:
        print_json(status_json(found))
    elif ctx.args.short:
        now = time.time()
        for line in short_lines(found, now, colour=wants_colour(sys.stdout, os.environ)):
            print(line)
        if found.get("stale_since") is not None:  # stdout stays one line per card, for scripts
            print(f"board: note: {stale_note(found, now)}", file=sys.stderr)
    else:
        print(status_text(found, time.time()))
    return EXIT_OK


# -- status --short: one line per card, as gpustat prints them, for scripts and `watch` ---------------------------

# SGR colours on a terminal only: red for what needs someone (LOST, HOST DOWN, a squatter, HOT, FULL)
RED, GREEN, YELLOW, CYAN, BOLD, RESET = "\x1b[31m", "\x1b[32m", "\x1b[33m", "\x1b[36m", "\x1b[1m", "\x1b[0m"


def wants_colour(stream, environ) -> bool:
    """Colour only on a terminal, and never under NO_COLOR (no-color.org) or TERM=dumb."""
    return stream.isatty() and not environ.get("NO_COLOR") and environ.get("TERM") != "dumb"


def short_name(name: str | None) -> str:
    """'RTX 5090' for 'NVIDIA GeForce RTX 5090': the vendor's words are the same on every card of the box."""
    from app.core.text import inert

    words = (name or "GPU").split()
    while len(words) > 1 and words[0] in ("NVIDIA", "GeForce"):
        words = words[1:]
    return inert(" ".join(words), 24)


def short_lines(found: dict, now: float, colour: bool = False) -> list[str]:
    """`board status --short`: '[3] RTX 5090 | 61°C  87 % | 24.1/31.8 GiB | alice until 18:00', one per card,
    the columns aligned across cards. Text from users (holders, process owners) is inert."""
    from app.core.text import format_time, inert

    def paint(text: str, code: str) -> str:
        return f"{code}{text}{RESET}" if colour else text

    def memory(c: dict) -> str:
        used, total = c["memory_used_mib"], c["memory_total_mib"]
        return "n/a" if used is None or not total else f"{used / 1024:.1f}/{total / 1024:.1f} GiB"

    cards = found["cards"]
    wheres = [f"[{inert(c['host'], 20)}:{c['index']}]" if many_hosts(found) else f"[{c['index']}]" for c in cards]
    names = [short_name(c["name"]) for c in cards]
    where_w, name_w = max(map(len, wheres), default=0), max(map(len, names), default=0)
    memory_w = max((len(memory(c)) for c in cards), default=0)
    lines = []
    for c, where, name in zip(cards, wheres, names):
        if c.get("host_down"):  # what its silent host last read is stale
            reading = paint(f"HOST DOWN since {format_time(int(c['down_since']), now)}", RED)
        elif c["state"] == "LOST":
            reading = paint("LOST: the driver no longer sees it", RED)
        else:
            temp, util = c["temperature_c"], c["utilization_pct"]
            reading = " ".join([
                paint(" n/a" if temp is None else f"{temp:>2}°C", RED if "HOT" in c["warnings"] else YELLOW),
                paint("n/a" if util is None else f"{util:>3} %", GREEN),
                "|", paint(memory(c).rjust(memory_w), RED if "FULL" in c["warnings"] else YELLOW)])
        booking, upcoming = c["booking"], c["next_booking"]
        if booking:
            holder = paint(f"{inert(booking['user'], 16)} until {format_time(booking['end'], now)}", BOLD)
        elif upcoming:
            holder = f"free until {format_time(upcoming['start'], now)} ({inert(upcoming['user'], 16)})"
        else:
            holder = "free"
        flags = [w for w in c["warnings"] if not c.get("host_down") and c["state"] != "LOST"]
        if c["state"] == "SQUATTED":
            flags.insert(0, f"SQUATTED by {inert(','.join(c['users']), 40) or 'someone'}")
        tail = f" | {paint(', '.join(flags), RED)}" if flags else ""
        lines.append(f"{paint(where.ljust(where_w), CYAN)} {name.ljust(name_w)} | {reading} | {holder}{tail}")
    return lines


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
    p = command("status", cmd_status, "every card: telemetry, state, current and next booking")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print JSON")
    form.add_argument("--short", action="store_true", help="one line per card (index, name, temperature, utilisation,"
                      " memory, holder and until), for scripts and watch")


def add_log(command) -> None:
    from app.cli.arguments import booking_id, event_limit  # argparse: not on the quick path

    p = command("log", cmd_log, "the audit log", json_flag=True)
    p.add_argument("--limit", type=event_limit, default=50, help="how many events (default 50)")
    p.add_argument("--booking", type=booking_id, help="only this booking's events")


def add_whoami(command) -> None:
    command("whoami", cmd_whoami, "who board thinks you are, and your role", json_flag=True)

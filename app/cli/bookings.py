"""`board book|list|ical|cancel|release|extend|wait` and `board series`: making, finding and changing bookings.

book, list, cancel and release are quick commands: app.quick runs their handlers without argparse, so
this module loads nothing heavy at the top; the parser's pieces load inside the add_* functions.
"""

from __future__ import annotations

import sys
from datetime import datetime

from app.errors import BadInput
from app.output import (EXIT_OK, booking_json, booking_line, iso, print_booking, print_json, print_series, say_notes,
                        stale_note)


def parse_cards(text: str) -> list[int]:
    from app.core.parse import parse_cards as parse  # one grammar for the CLI and the TUI: 0,1 and 4-7

    return parse(text)


def card_spec(text: str | None) -> dict:
    """--cards as the operations take it: {"cards": [...]}, with "host" for another host's ('gpu2:0-3')."""
    if text is None:
        return {}
    from app.core.parse import parse_card_spec  # one grammar for the CLI and the TUI

    host, cards = parse_card_spec(text)
    return {"cards": cards, **({"host": host} if host is not None else {})}


def cmd_book(ctx) -> int:
    if series_asked(ctx.args):
        return cmd_book_series(ctx)
    args = ctx.args
    if args.count is None and args.cards is None and not getattr(args, "model", None):
        raise BadInput("say which cards: a count (board book 2), --cards 0,1, or --model M.gguf to size it")
    if args.count is not None and args.cards is not None:
        raise BadInput("give a count or --cards, not both")
    from app.core.parse import parse_span

    notes: list[str] = []
    start, end = parse_span(args.start, args.duration, args.until, ctx.now(), night_start=ctx.night_start,
                            how_long="say how long: --for 3h, --until 18:00, or a range such as --start 'tomorrow 9-19'",
                            notes=notes)
    say_notes(notes)
    spec = card_spec(args.cards)
    cards = spec.get("cards")
    count, request = args.count, None
    if getattr(args, "model", None):  # only the full parser knows --model: it reads the GGUF, so no quick path
        from app.cli.fit import settings_from
        from app.fit.request import for_booking, limits

        count, request = for_booking(args.model, settings_from(args), limits(ctx.config), count=count, cards=cards)
        count = None if cards is not None else count
    or_later = bool(getattr(args, "asap", False) or getattr(args, "or_later", False))
    booking = ctx.client.call(
        "book", cards=cards, count=count, start=start, end=end, note=args.note, request=request,
        **{"class": args.klass}, **({"or_later": True} if or_later else {}), **({"host": spec["host"]} if "host" in spec else {}),
        **({"force": True} if getattr(args, "force", False) else {}),  # the quick parser has no --force
        **({"project": args.project} if args.project else {}),
    )
    print_booking(booking, "booked", args.json, here=ctx.here)
    from app.core.text import inert  # notes name other users and their processes

    for note in booking.get("notes") or ():
        print(f"board: note: {inert(note)}", file=sys.stderr)
    if booking.get("queued") and booking["start"] > ctx.now().timestamp():
        print(f"board: queued: booking {booking['id']} moves up by itself when time frees earlier;"
              f" 'board wait {booking['id']}' waits for it to start", file=sys.stderr)
    return EXIT_OK


def cmd_list(ctx) -> int:
    from app.core.timeparse import TimeInputError, parse_when

    args, now = ctx.args, ctx.now()
    try:
        start = int(parse_when(args.from_, now).timestamp()) if args.from_ else (None if args.all else int(now.timestamp()))
        end = int(parse_when(args.to, now).timestamp()) if args.to else None
    except TimeInputError as error:
        raise BadInput(str(error)) from None
    listed = ctx.client.call("list", start=start, end=end, user=args.user, mine=args.mine, include_cancelled=args.all)
    found, stale_since = listed["bookings"], listed.get("stale_since")
    if stale_since is not None:  # the database unreachable: the service's last read (app.service.fleet.lastknown)
        print(stale_note(listed, now.timestamp()), file=sys.stderr)
    if args.json:
        print_json({"bookings": [booking_json(b) for b in found],
                    **({"stale_since": iso(stale_since)} if stale_since is not None else {})})
    elif not found:
        print("no bookings" + ("" if args.all else " from now on; --all shows past and cancelled ones"))
    else:
        here = ctx.here
        print("\n".join(booking_line(b, here=here) for b in found))
    return EXIT_OK


ICAL_PAST, ICAL_AHEAD = 7, 90  # days: the default window of `board ical`, from a week ago to a quarter on


def cmd_ical(ctx) -> int:
    """Live bookings as an RFC 5545 calendar on stdout (app.core.ical). Everyone's by default, from a week ago to
    90 days on (from --from, if that is later); --all drops the default window; --cards keeps those holding any."""
    from datetime import timedelta
    from socket import gethostname

    from app.core.ical import calendar
    from app.core.timeparse import TimeInputError, parse_when
    from app.model import booking_from_wire

    args, now = ctx.args, ctx.now()
    cards = set(parse_cards(args.cards)) if args.cards is not None else None
    try:
        start = parse_when(args.from_, now, night_start=ctx.night_start) if args.from_ else None
        end = parse_when(args.to, now, night_start=ctx.night_start) if args.to else None
    except TimeInputError as error:
        raise BadInput(str(error)) from None
    if not args.all:
        start = start or now - timedelta(days=ICAL_PAST)
        end = end or max(now, start) + timedelta(days=ICAL_AHEAD)
    if start is not None and end is not None and end <= start:
        raise BadInput(f"--to {end:%Y-%m-%d %H:%M} is not after --from {start:%Y-%m-%d %H:%M}")
    listed = ctx.client.call("list", start=None if start is None else int(start.timestamp()),
                             end=None if end is None else int(end.timestamp()), user=args.user, mine=args.mine)
    if listed.get("stale_since") is not None:  # the database unreachable: the service's last read, as `list` says
        print(stale_note(listed, now.timestamp()), file=sys.stderr)
    bookings = [booking_from_wire(b) for b in listed["bookings"] if cards is None or cards & set(b["cards"])]
    host = gethostname()
    sys.stdout.flush()
    sys.stdout.buffer.write(calendar(bookings, domain=host, name=f"board on {host}"))
    sys.stdout.flush()
    return EXIT_OK


def cmd_cancel(ctx) -> int:
    print_booking(ctx.client.call("cancel", id=ctx.args.id), "cancelled", ctx.args.json)
    return EXIT_OK


def cmd_release(ctx) -> int:
    print_booking(ctx.client.call("release", id=ctx.args.id), "released", ctx.args.json)
    return EXIT_OK


def cmd_extend(ctx) -> int:
    """--until reads as in `book`, with the booking's current end as the start: 20:00 is the first 20:00 after it."""
    args = ctx.args
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


def cmd_wait(ctx) -> int:
    """Block until the booking starts, then print its cards (a move by the backfill or an admin is followed)."""
    from app.client.wait import wait_for_start

    booking = wait_for_start(ctx.client, ctx.args.id, timeout=ctx.args.timeout)
    if ctx.args.json:
        print_json(booking_json(booking))
    else:
        print(",".join(str(c) for c in booking["cards"]))
    return EXIT_OK


# -- series (standing slots) ---------------------------------------------------------------------

SERIES_FLAGS = {"every": "--every", "from_date": "--from", "to_date": "--to", "skip_conflicts": "--skip-conflicts",
                "override_policy": "--override-policy"}


def series_asked(args) -> bool:
    """Whether `book` was given any series flag (the quick parser knows none of them)."""
    return any(getattr(args, name, None) not in (None, False) for name in SERIES_FLAGS)


def cmd_book_series(ctx) -> int:
    """`book --every ...`: a standing slot. --start/--until are times of day, --from/--to the first and last days."""
    import re

    args = ctx.args
    if args.every is None:
        given = next(flag for name, flag in SERIES_FLAGS.items() if getattr(args, name, None) not in (None, False))
        raise BadInput(f"{given} is for a series; add --every weekday (or day, weekend, week, mon,wed,fri)")
    if args.count is not None or args.cards is None:
        raise BadInput("a series books the same cards each time: give --cards, such as --cards 0-3")
    if getattr(args, "model", None):
        raise BadInput("--model is not for a series; size it with 'board fit M.gguf' and give --cards")
    start, until = args.start, args.until
    if until is None and (both := re.fullmatch(r"\s*(\d{1,2}(?::\d{2})?)\s*-\s*(\d{1,2}(?::\d{2})?)\s*", start)):
        start, until = both[1], both[2]  # --start 9-19
    if args.duration is not None or until is None or start == "now":
        raise BadInput("with --every, give --start and --until as times of day, such as --start 9:00 --until 19:00"
                       " (--start 19:00 --until 7:00 ends the next morning)")
    if args.to_date is None:
        raise BadInput("give --to DATE, the last day of the series, such as --to 2027-03-31")
    now = ctx.now()
    result = ctx.client.call(
        "series_book", **card_spec(args.cards), every=args.every, start=start, until=until,
        to=series_date(args.to_date, "--to", now), note=args.note, skip_conflicts=args.skip_conflicts,
        override_policy=args.override_policy, **({"project": args.project} if args.project else {}),
        **{"class": args.klass, "from": series_date(args.from_date, "--from", now) if args.from_date else None},
    )
    print_series(result, "booked", args.json)
    return EXIT_OK


def series_date(text: str, what: str, now: datetime) -> str:
    """A day for --from/--to: 2026-12-07 as given (the service reads it), or a day word (today, tomorrow, mon)."""
    import re

    from app.core.timeparse import TimeInputError, parse_when

    if re.fullmatch(r"\s*\d{4}-\d{1,2}-\d{1,2}\s*", text):
        return text.strip()
    try:
        return parse_when(text, now).date().isoformat()
    except TimeInputError:
        from app.core.text import inert

        raise BadInput(f"can't read {what} {inert(text.strip(), 40)!r} as a day; give a date such as 2026-12-07,"
                       " or today, tomorrow, mon") from None


def cmd_series(ctx) -> int:
    raise BadInput("say which: board series show SID, board series cancel SID, board series extend SID --to DATE")


def cmd_series_show(ctx) -> int:
    print_series(ctx.client.call("series_get", id=ctx.args.id), None, ctx.args.json, every_booking=True)
    return EXIT_OK


def cmd_series_cancel(ctx) -> int:
    print_series(ctx.client.call("series_cancel", id=ctx.args.id), "cancelled", ctx.args.json)
    return EXIT_OK


def cmd_series_extend(ctx) -> int:
    args = ctx.args
    result = ctx.client.call("series_extend", id=args.id, to=series_date(args.to_date, "--to", ctx.now()),
                             skip_conflicts=args.skip_conflicts, override_policy=args.override_policy)
    print_series(result, "extended", args.json)
    return EXIT_OK


# -- the parser: app.cli.build_parser calls these in the order `board --help` lists them --------------
# The argument types (app.cli.arguments) bring argparse with them, so they are imported in here, not at the top.

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


def add_book(command) -> None:
    from app.cli.arguments import card_count
    from app.cli.fit import add_request_options

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
    p.add_argument("--project", metavar="NAME",
                   help="the project it is for, when you are in several ('board projects' lists them)")
    p.add_argument("--force", action="store_true",
                   help="book the named cards (--cards gpu2:0) now even though their host is down (HOST DOWN);"
                        " an admin's booking past its project's budget (audited)")
    p.add_argument("--model", metavar="M.gguf", help="size the booking from this model (with --ctx, --parallel): "
                                                       "picks the smallest group of cards that fits, and stores the request")
    add_request_options(p)
    add_series_options(p)


def add_series_options(p) -> None:
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


def add_list(command) -> None:
    p = command("list", cmd_list, "bookings from now on (or a window)", json_flag=True)
    who = p.add_mutually_exclusive_group()
    who.add_argument("--mine", action="store_true", help="only mine")
    who.add_argument("--user", help="only this user's")
    p.add_argument("--from", dest="from_", metavar="WHEN", help="window start (default now)")
    p.add_argument("--to", metavar="WHEN", help="window end")
    p.add_argument("--all", action="store_true", help="include past and cancelled bookings")


def add_ical(command) -> None:
    p = command("ical", cmd_ical, "live bookings as an iCalendar file (RFC 5545) on stdout: board ical > board.ics")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--mine", action="store_true", help="only mine")
    who.add_argument("--user", help="only this user's")
    p.add_argument("--cards", help="only bookings that hold any of these cards, e.g. 0-3")
    p.add_argument("--all", action="store_true", help="no default window: past bookings too, and all ahead")
    p.add_argument("--from", dest="from_", metavar="WHEN", help="window start (default 7 days ago)")
    p.add_argument("--to", metavar="WHEN", help="window end (default 90 days after now, or after --from if later)")


def add_cancel_release(command) -> None:
    from app.cli.arguments import booking_id

    for name, handler, help in (
        ("cancel", cmd_cancel, "cancel a booking (an active one ends now)"),
        ("release", cmd_release, "end an active booking now"),
    ):
        p = command(name, handler, help, json_flag=True)
        p.add_argument("id", type=booking_id, help="booking id")


def add_extend(command) -> None:
    from app.cli.arguments import booking_id

    p = command("extend", cmd_extend, "make a booking longer, if the time after it is free", json_flag=True)
    p.add_argument("id", type=booking_id, help="booking id")
    span = p.add_mutually_exclusive_group(required=True)
    span.add_argument("--for", dest="duration", metavar="DUR", help="add this much time")
    span.add_argument("--until", metavar="WHEN",
                      help="the new end: fri 18:00; a bare 20:00 is the first after the current end, +2h is after it")


def add_series(command, common) -> None:
    """`board series show|cancel|extend SID`: a standing slot made with `board book --every`."""
    from app.cli.arguments import series_id

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


def add_wait(command) -> None:
    from app.cli.arguments import booking_id, seconds

    p = command("wait", cmd_wait, "wait until a booking starts, then print its cards (exit 3 if it is cancelled)",
                json_flag=True)
    p.add_argument("id", type=booking_id, help="booking id")
    p.add_argument("--timeout", type=seconds, metavar="DUR", help="give up after this long (exit 3), e.g. 2h")

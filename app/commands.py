"""The command context and the commands the shell runs most: status, book, list, cancel, release, whoami.

Both front doors run these: app.quick (no argparse, for speed) and app.cli (the full parser).
They only talk to the service through `ctx.client` and print through app.output.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from functools import cached_property

from app.errors import BadInput, BoardError
from app.output import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNEXPECTED, booking_line, print_booking, print_json, status_json, status_text


class Context:
    """What a command needs, each piece opened only when first used: its arguments, the config, the client."""

    def __init__(self, args, environ=os.environ, client=None):
        self.args, self.environ = args, environ
        if client is not None:
            self.client = client

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
            config = load_config(db, self.environ)
        except ConfigError as error:
            raise BadInput(str(error)) from None
        if self.demo is not None:  # the demo's pools, so its board shows the rules its service keeps
            from app.demo import demo_config

            config = demo_config(config)
        return config

    @cached_property
    def client(self):
        """The one door to the service: its socket where the config names one, else the service in this process."""
        from app.client import open_client

        explicit_db = getattr(self.args, "db", None) is not None or bool(self.environ.get("BOARD_DB"))
        return open_client(self.config, demo=self.demo, explicit_db=explicit_db, environ=self.environ)

    @cached_property
    def me(self):
        """This process's own identity (file mode only: through the socket, the service says who we are)."""
        from app.core.identity import current_identity

        return current_identity(self.config.admin_group)

    @cached_property
    def conn(self):
        """A connection to a database file this user owns (`board agent` in file mode)."""
        from app.store.db import connect

        return connect(self.config.db_path)

    def now(self) -> datetime:
        return datetime.now().astimezone()

    def night_start(self) -> int:
        """What `tonight` means, in minutes after midnight: read from the config only when someone says it."""
        return self.config.booking.night_start_minute


def check_arguments(argv) -> int | None:
    """Bytes that are not UTF-8 arrive as lone surrogates, which SQLite cannot store: one line and exit 2."""
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            print(f"board: the argument {arg[:60]!r} is not valid UTF-8; check the terminal's encoding (LANG)",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
    return None


def run_command(handler, ctx: Context) -> int:
    """Run one command: a BoardError is one inert line on stderr and its exit code, never a traceback."""
    try:
        return handler(ctx)
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


# -- arguments -----------------------------------------------------------------------------------


def parse_cards(text: str) -> list[int]:
    from app.core.parse import parse_cards as parse  # one grammar for the CLI and the TUI: 0,1 and 4-7

    return parse(text)


# -- commands ------------------------------------------------------------------------------------


def say_notes(notes: list[str]) -> None:
    """What reading the times noticed (a wall time the clocks show twice: which was taken), on stderr."""
    for note in notes:
        print(f"board: note: {note}", file=sys.stderr)


def cmd_status(ctx: Context) -> int:
    found = ctx.client.call("status")
    if ctx.args.json:
        print_json(status_json(found))
    else:
        print(status_text(found, time.time()))
    return EXIT_OK


def cmd_book(ctx: Context) -> int:
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
    cards = parse_cards(args.cards) if args.cards is not None else None
    count, request = args.count, None
    if getattr(args, "model", None):  # only the full parser knows --model: it reads the GGUF, so no quick path
        from app.fit.cli import settings_from
        from app.fit.request import for_booking, limits

        count, request = for_booking(args.model, settings_from(args), limits(ctx.config), count=count, cards=cards)
        count = None if cards is not None else count
    or_later = bool(getattr(args, "asap", False) or getattr(args, "or_later", False))
    booking = ctx.client.call(
        "book", cards=cards, count=count, start=start, end=end, note=args.note, request=request,
        **{"class": args.klass}, **({"or_later": True} if or_later else {}),
    )
    print_booking(booking, "booked", args.json)
    from app.core.text import inert  # notes name other users and their processes

    for note in booking.get("notes") or ():
        print(f"board: note: {inert(note)}", file=sys.stderr)
    if booking.get("queued") and booking["start"] > ctx.now().timestamp():
        print(f"board: queued: booking {booking['id']} moves up by itself when time frees earlier;"
              f" 'board wait {booking['id']}' waits for it to start", file=sys.stderr)
    return EXIT_OK


def cmd_list(ctx: Context) -> int:
    from app.core.timeparse import TimeInputError, parse_when
    from app.output import booking_json

    args, now = ctx.args, ctx.now()
    try:
        start = int(parse_when(args.from_, now).timestamp()) if args.from_ else (None if args.all else int(now.timestamp()))
        end = int(parse_when(args.to, now).timestamp()) if args.to else None
    except TimeInputError as error:
        raise BadInput(str(error)) from None
    found = ctx.client.call("list", start=start, end=end, user=args.user, mine=args.mine, include_cancelled=args.all)
    if args.json:
        print_json({"bookings": [booking_json(b) for b in found]})
    elif not found:
        print("no bookings" + ("" if args.all else " from now on; --all shows past and cancelled ones"))
    else:
        print("\n".join(booking_line(b) for b in found))
    return EXIT_OK


ICAL_PAST, ICAL_AHEAD = 7, 90  # days: the default window of `board ical`, from a week ago to a quarter on


def cmd_ical(ctx: Context) -> int:
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
    found = ctx.client.call("list", start=None if start is None else int(start.timestamp()),
                            end=None if end is None else int(end.timestamp()), user=args.user, mine=args.mine)
    bookings = [booking_from_wire(b) for b in found if cards is None or cards & set(b["cards"])]
    host = gethostname()
    sys.stdout.flush()
    sys.stdout.buffer.write(calendar(bookings, domain=host, name=f"board on {host}"))
    sys.stdout.flush()
    return EXIT_OK


def cmd_cancel(ctx: Context) -> int:
    print_booking(ctx.client.call("cancel", id=ctx.args.id), "cancelled", ctx.args.json)
    return EXIT_OK


def cmd_release(ctx: Context) -> int:
    print_booking(ctx.client.call("release", id=ctx.args.id), "released", ctx.args.json)
    return EXIT_OK


def cmd_whoami(ctx: Context) -> int:
    me = ctx.client.call("whoami")
    if ctx.args.json:
        print_json(me)
    else:
        role = "admin" if me["admin"] else "member"
        where = f"database {me['db']}" if me["db"] else f"the board service at {getattr(ctx.client, 'path', '?')}"
        print(f"{me['user']} (uid {me['uid']}), {role}; {where}")
    return EXIT_OK


# -- series (standing slots) ---------------------------------------------------------------------

SERIES_FLAGS = {"every": "--every", "from_date": "--from", "to_date": "--to", "skip_conflicts": "--skip-conflicts",
                "override_policy": "--override-policy"}


def series_asked(args) -> bool:
    """Whether `book` was given any series flag (the quick parser knows none of them)."""
    return any(getattr(args, name, None) not in (None, False) for name in SERIES_FLAGS)


def cmd_book_series(ctx: Context) -> int:
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
        "series_book", cards=parse_cards(args.cards), every=args.every, start=start, until=until,
        to=series_date(args.to_date, "--to", now), note=args.note, skip_conflicts=args.skip_conflicts,
        override_policy=args.override_policy,
        **{"class": args.klass, "from": series_date(args.from_date, "--from", now) if args.from_date else None},
    )
    from app.output import print_series

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


def cmd_series(ctx: Context) -> int:
    raise BadInput("say which: board series show SID, board series cancel SID, board series extend SID --to DATE")


def cmd_series_show(ctx: Context) -> int:
    from app.output import print_series

    print_series(ctx.client.call("series_get", id=ctx.args.id), None, ctx.args.json, every_booking=True)
    return EXIT_OK


def cmd_series_cancel(ctx: Context) -> int:
    from app.output import print_series

    print_series(ctx.client.call("series_cancel", id=ctx.args.id), "cancelled", ctx.args.json)
    return EXIT_OK


def cmd_series_extend(ctx: Context) -> int:
    from app.output import print_series

    args = ctx.args
    result = ctx.client.call("series_extend", id=args.id, to=series_date(args.to_date, "--to", ctx.now()),
                             skip_conflicts=args.skip_conflicts, override_policy=args.override_policy)
    print_series(result, "extended", args.json)
    return EXIT_OK

"""`board admin reassign|move ID`: an admin gives a booking other cards, another holder or new times."""

from __future__ import annotations

from app.cli.arguments import booking_id
from app.errors import BadInput
from app.output import EXIT_OK, print_booking, say_notes


def cmd_admin(ctx) -> int:
    raise BadInput("say which admin action: board admin reassign ID (--cards 4,5 | --user NAME),"
                   " or board admin move ID --start WHEN (--for DUR | --until WHEN)")


def cmd_reassign(ctx) -> int:
    from app.cli.bookings import card_spec

    args = ctx.args
    spec = card_spec(args.cards)  # another host's cards ('gpu2:0-3') must be the booking's host's
    print_booking(ctx.client.call("reassign", id=args.id, **spec, user=args.user, force=args.force),
                  "reassigned", args.json, here=ctx.here)
    return EXIT_OK


def cmd_move(ctx) -> int:
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


def add_parser(command, common) -> None:
    p = command("admin", cmd_admin, "admin actions")
    admin = p.add_subparsers(title="admin commands", metavar="ACTION")
    p = admin.add_parser("reassign", help="move a booking to other cards or another user", parents=[common])
    p.set_defaults(handler=cmd_reassign)
    p.add_argument("id", type=booking_id, help="booking id")
    p.add_argument("--json", action="store_true", help="print JSON")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--cards", help="the new cards, as many as before")
    target.add_argument("--user", help="the new holder")
    p.add_argument("--force", action="store_true",
                   help="move or give it away even while its servers or jobs run (they are stopped) or the old"
                        " holder's server is planned on it (the plan does not start on it)")
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

"""`board run [--booking ID] [--wait] -- CMD`: exec a command that sees only the booked cards."""

from __future__ import annotations

import argparse
import os
import sys

from app.cli.arguments import booking_id
from app.errors import BadInput, NotPermitted
from app.output import EXIT_UNEXPECTED, iso


def cmd_run(ctx) -> int:
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


def add_parser(command) -> None:
    p = command("run", cmd_run, "run a command on your booked cards only")
    p.add_argument("--booking", type=booking_id, help="which of your active bookings (default: the only one)")
    p.add_argument("--wait", action="store_true",
                   help="wait for the booking (--booking) to start, then run: a night job starts itself")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

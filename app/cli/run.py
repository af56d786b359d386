"""`board run [--booking ID] [--wait] -- CMD`: exec a command that sees only the booked cards;
`board run --booking ID --docker IMAGE [DOCKER ARGS] -- CMD`: the same in a container given exactly those cards."""

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
    if not command and args.docker is None:  # a container may run its image's own command
        raise BadInput("give a command to run: board run -- python train.py")
    if args.docker is not None and (not args.docker or args.docker[0].startswith("-")):
        raise BadInput("--docker needs the image first: board run --booking ID --docker IMAGE [DOCKER ARGS] -- CMD")
    if args.docker is not None:  # before the booking is asked for: nothing reaches docker or the service
        from app.cli.docker_options import Options, check  # start-up: only containers need the table

        check(args.docker[1:], Options(os.getuid(), ctx.config.llama.model_dirs))
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
    if args.docker is not None:
        return run_container(ctx, booking, args.docker, command)
    end = iso(booking["end"])
    assert end is not None  # every booking ends
    env = dict(os.environ, CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=uuids, NVIDIA_VISIBLE_DEVICES=uuids,
               BOARD_BOOKING_ID=str(booking["id"]), BOARD_BOOKING_END=end)
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        raise BadInput(f"command not found: {command[0]}") from None
    except PermissionError:
        raise NotPermitted(f"can't execute {command[0]}: permission denied") from None
    return EXIT_UNEXPECTED  # not reached


def docker_command(booking: dict, docker: list[str], command: list[str], name: str) -> list[str]:
    """`docker run` on exactly the booking's cards: --gpus and NVIDIA_VISIBLE_DEVICES name their UUIDs (a container
    that sees all the cards voids every quota), and the label names the booking. `docker` is IMAGE, then the
    user's own docker run options."""
    image, options = docker[0], docker[1:]
    uuids = ",".join(booking["card_uuids"])
    return ["docker", "run", "--rm", "--name", name,
            "--gpus", f'"device={uuids}"',  # the quotes are docker's: the comma would split the option otherwise
            "-e", f"NVIDIA_VISIBLE_DEVICES={uuids}", "-e", "CUDA_DEVICE_ORDER=PCI_BUS_ID",
            "-e", f"BOARD_BOOKING_ID={booking['id']}", "-e", f"BOARD_BOOKING_END={iso(booking['end'])}",
            "--label", f"board.booking={booking['id']}", *options, image, *command]


def run_container(ctx, booking: dict, docker: list[str], command: list[str]) -> int:
    """Run the container in the foreground and stay its parent: this process is the registered job. When the service
    ends the booking it sends this process (and its group: the docker client) SIGTERM; then `docker stop` gives the
    container half the grace to exit, before the service's SIGKILL after the grace. The docker client alone would
    die of SIGKILL and leave the container running."""
    import signal
    import subprocess

    name = f"board-{booking['id']}-{os.getpid()}"
    grace = max(1, int(ctx.config.enforce.grace_s // 2))

    def stop(signum, frame) -> None:
        print(f"board: stopping container {name} (docker stop --time {grace})", file=sys.stderr, flush=True)
        subprocess.run(["docker", "stop", "--time", str(grace), name], stdout=subprocess.DEVNULL, check=False)

    signal.signal(signal.SIGTERM, stop)
    sys.stdout.flush()
    try:
        child = subprocess.Popen(docker_command(booking, docker, command, name))
    except FileNotFoundError:
        raise BadInput("docker not found on PATH: install Docker and the NVIDIA Container Toolkit") from None
    while True:
        try:
            code = child.wait()
        except KeyboardInterrupt:  # ^C reached the docker client too, which passes it to the container
            continue
        return 128 - code if code < 0 else code  # killed by a signal: as a shell reports it


def add_parser(command) -> None:
    p = command("run", cmd_run, "run a command on your booked cards only")
    p.add_argument("--booking", type=booking_id, help="which of your active bookings (default: the only one)")
    p.add_argument("--wait", action="store_true",
                   help="wait for the booking (--booking) to start, then run: a night job starts itself")
    p.add_argument("--docker", nargs=argparse.REMAINDER, metavar="IMAGE [DOCKER ARGS]",
                   help="run CMD in a container of IMAGE given only the booked cards (docker run --gpus, label"
                        " board.booking=ID); last before --")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

"""`board faults [--since 30d] [--kind KIND] [--json]`: the Xid events, OOM exits and throttling the service recorded."""

from __future__ import annotations

from app.cli.arguments import seconds
from app.output import EXIT_OK, iso, print_json

DESCRIPTION = ("The faults the service recorded on the cards: Xid events from the driver (with their meaning), servers"
               " and board run jobs that ran out of GPU memory, thermal throttling with how long it lasted, and"
               " llama-servers built without the cards' architecture (build: no kernel image is available).")


def add_parser(command) -> None:
    p = command("faults", cmd_faults, "Xid events, out-of-memory exits and thermal throttling on the cards",
                json_flag=True)
    p.description = DESCRIPTION
    p.add_argument("--since", type=seconds, default=30 * 86400.0, metavar="DUR",
                   help="how far back, e.g. 7d, 12h (default 30d)")
    p.add_argument("--kind", choices=("xid", "oom", "throttle", "build"), help="only this kind")


def cmd_faults(ctx) -> int:
    import time

    from app.core.text import format_time, inert

    now = time.time()
    found = ctx.client.call("faults", since=int(now - ctx.args.since), kind=ctx.args.kind)
    if getattr(ctx.args, "json", False):
        print_json({"since": iso(found["since"]), "counts": found["counts"],
                    "faults": [{**f, "ts": iso(f["ts"])} for f in found["faults"]]})
        return EXIT_OK
    counts = ", ".join(f"{n} {kind}" for kind, n in found["counts"].items())
    print(f"faults since {format_time(found['since'], now)}: {counts}")
    for f in found["faults"]:
        card = f"card {f['card']}" if f["card"] is not None else inert(f["card_uuid"] or "-", 12)
        who = inert(f["user"], 12) if f["user"] else "-"
        booking = f" #{f['booking_id']}" if f["booking_id"] is not None else ""
        lasted = f" for {_span(f['duration_s'])}" if f["duration_s"] is not None else ""
        print(f"{format_time(f['ts'], now):<16} {card:<8} {f['kind']:<8} {who}{booking}  {inert(f['detail'], 160)}{lasted}")
    return EXIT_OK


def _span(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"

"""`board notify test [--target NAME]`: send one message to the chat targets now and report each one's HTTP status.

Admins only (the targets are the team's chat). The service sends it from its delivery thread; this command
follows the outbox rows until each has had its one try. Targets are named by name, type and host, never by url.
Exit codes: 0 every target answered 2xx, 1 some target did not (or not in time), 2 no such target or none
configured, 4 not an admin.
"""

from __future__ import annotations

from app.errors import BadInput
from app.output import EXIT_OK, EXIT_UNEXPECTED, print_json

POLL_S = 0.2
DESCRIPTION = ("Admins: send one test message to each chat target now (or to --target NAME) and show its HTTP status."
               " Exit 0 when every target answered 2xx, 1 when one did not, 2 when there is no such target, 4 when"
               " you are not an admin.")


def add_parser(command, common) -> None:
    p = command("notify", cmd_notify, "pushes to the team's chat ([[notify.targets]] in the config): test them")
    actions = p.add_subparsers(title="notify commands", metavar="ACTION")
    a = actions.add_parser("test", help="admins: send one test message now and show each target's HTTP status",
                           description=DESCRIPTION, parents=[common])
    a.set_defaults(handler=cmd_test)
    a.add_argument("--target", metavar="NAME", help="only this target (its name in [[notify.targets]])")
    a.add_argument("--json", action="store_true", help="print JSON")


def cmd_notify(ctx) -> int:
    raise BadInput("say which notify action: board notify test [--target NAME]")


def cmd_test(ctx) -> int:
    import time

    from app.core.text import inert

    client = ctx.client
    queued = client.call("notify_test", target=ctx.args.target)
    deadline = time.monotonic() + float(queued["wait_s"])
    while True:
        rows = client.call("notify_status", ids=queued["ids"])
        if all(r["attempts"] or r["state"] != "pending" for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    ok = all(r["state"] == "sent" for r in rows)
    if getattr(ctx.args, "json", False):
        print_json({"ok": ok, "targets": rows})
        return EXIT_OK if ok else EXIT_UNEXPECTED
    for r in rows:
        status = f"HTTP {r['status']}" if r["status"] is not None else "no HTTP answer"
        if r["state"] == "sent":
            outcome = "sent"
        elif r["attempts"]:
            outcome = f"not sent: {inert(str(r['error']), 200)}"
        else:
            outcome = "not tried yet (the service's delivery thread is busy); try again later"
        print(f"{inert(r['where'], 200)}: {status}, {outcome}")
    return EXIT_OK if ok else EXIT_UNEXPECTED


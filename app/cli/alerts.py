"""`board alerts [--all] [--json] [--limit N]`: what the service's alert rules find now (or lately, with --all).

Any member may look; an alert for one user alone (their booking ends soon) shows only to that user.
Exit codes: 0 shown (firing or not), 2 bad input, 1 the service failed.
"""

from __future__ import annotations

from app.output import EXIT_OK, iso, print_json, table


def add_parser(command) -> None:
    p = command("alerts", cmd_alerts, "the alerts firing now (--all: resolved ones too): thresholds from [alerts]",
                json_flag=True)
    p.add_argument("--all", action="store_true", help="resolved alerts too, newest first")
    p.add_argument("--limit", type=int, default=200, metavar="N", help="at most N alerts (default 200)")


def cmd_alerts(ctx) -> int:
    from app.core.text import format_time, inert

    found = ctx.client.call("alerts", all=ctx.args.all, limit=ctx.args.limit)
    if ctx.args.json:
        print_json([{**a, "fired_at": iso(a["fired_at"]), "resolved_at": iso(a["resolved_at"]),
                     "last_seen": iso(a["last_seen"])} for a in found])
        return EXIT_OK
    if not found:
        print("no alerts firing" if not ctx.args.all else "no alerts")
        return EXIT_OK
    rows = [["STATE", "SINCE", "RULE", "ALERT"]]
    for a in found:
        since = format_time(a["fired_at"])
        if a["state"] == "resolved":
            since += f" to {format_time(a['resolved_at'])}"
        rows.append([a["state"], since, a["rule"], inert(a["message"], 300)])
    print(table(rows))
    return EXIT_OK

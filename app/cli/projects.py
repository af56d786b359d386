"""`board projects [--json]`: what each project ([[projects]]) has and spends, as the service counts it.

Exit codes: 0 ok (a board without projects too: it says so), 2 bad input.
"""

from __future__ import annotations

from app.output import EXIT_OK, iso, print_json, table

DESCRIPTION = ("Each project in the service's config ([[projects]], docs/projects.md): its members, the classes it may"
               " book, its allocations (cards it holds on a schedule), its GPU-hour budget with what is used from the"
               " period's start to now and booked from now to the reset, and its gateway tokens today against its"
               " daily budget. Every member sees every project; yours are named at the end.")


def add_parser(command) -> None:
    p = command("projects", cmd_projects, "each project's members, classes, allocations, budget and use this period",
                json_flag=True)
    p.description = DESCRIPTION


def projects_json(doc: dict) -> dict:
    """The `projects` reply as `--json` shows it: ISO times in the reader's zone (docs/json.md)."""
    return {"now": iso(doc["now"]), "zone": doc["zone"], "note": doc["note"],
            "projects": [{**p, "period_start": iso(p["period_start"]), "resets_at": iso(p["resets_at"])}
                         for p in doc["projects"]]}


def cmd_projects(ctx) -> int:
    doc = ctx.client.call("projects")
    if ctx.args.json:
        print_json(projects_json(doc))
    else:
        print(projects_text(doc))
    return EXIT_OK


def projects_text(doc: dict) -> str:
    """The table, a line per allocation, and the caller's projects; names from the config are shown inert."""
    from app.core.text import format_cards, format_time, inert

    if not doc["projects"]:
        return doc["note"]
    now = doc["now"]
    lines = [["PROJECT", "MEMBERS", "CLASSES", "BUDGET", "USED", "BOOKED", "LEFT", "RESETS", "TOKENS TODAY"]]
    for p in doc["projects"]:
        budget = "-" if p["gpu_hours"] is None else f"{p['gpu_hours']:g} h/{p['period']}"
        left = "-" if p["remaining_hours"] is None else f"{p['remaining_hours']:.1f} h"
        tokens = str(p["tokens_today"]) + (f"/{p['tokens_per_day']}" if p["tokens_per_day"] is not None else "")
        lines.append([inert(p["name"], 40), inert(",".join(p["members"]), 40), ",".join(p["classes"]), budget,
                      f"{p['used_hours']:.1f} h", f"{p['booked_hours']:.1f} h", left,
                      format_time(p["resets_at"], now), tokens])
    out = [table(lines)]
    for p in doc["projects"]:
        for a in p["allocations"]:
            pool = f" (pool {inert(a['pool'], 40)})" if a["pool"] else ""
            out.append(f"{inert(p['name'], 40)} holds cards {format_cards(a['cards'])}{pool} {a['days']} {a['hours']}"
                       f" {inert(doc['zone'], 40)}")
    mine = [inert(p["name"], 40) for p in doc["projects"] if p["mine"]]
    out.append(f"your projects: {', '.join(mine)}" if mine else "you are in no project; ask an admin to add you")
    return "\n".join(out)

"""`board report`'s table and CSV from the report document (app.report.compute)."""

from __future__ import annotations

import csv
import io

from app.core.text import inert

COLUMNS = (  # (document field, heading, format)
    ("booked_h", "BOOKED h", "{:.1f}"), ("used_h", "USED h", "{:.1f}"), ("used_pct", "USED", "{:.0f} %"),
    ("idle_h", "IDLE h", "{:.1f}"), ("idle_pct", "IDLE", "{:.0f} %"), ("squatted_h", "SQUAT h", "{:.1f}"),
    ("util_mean_pct", "UTIL", "{:.0f} %"), ("wait_mean_min", "WAIT", "{:.0f} min"),
    ("wait_p90_min", "WAIT p90", "{:.0f} min"), ("bookings", "BOOKINGS", "{}"),
)
CSV_FIELDS = ("key", "booked_h", "used_h", "used_pct", "idle_h", "idle_pct", "squatted_h", "util_mean_pct",
              "wait_mean_min", "wait_p90_min", "wait_n", "bookings")


def _cell(value, form: str) -> str:
    return "-" if value is None else form.format(value)


def _aligned(by: str, rows: list[dict], total: dict | None = None) -> list[str]:
    """The rows' lines: names left, figures right; with `total`, a rule and the totals row under them."""
    heading = [by.upper()] + [h for _, h, _ in COLUMNS]
    body = [[inert(str(r["key"]), 32)] + [_cell(r[f], form) for f, _, form in COLUMNS] for r in rows]
    ending = [] if total is None else [["TOTAL"] + [_cell(total[f], form) for f, _, form in COLUMNS]]
    widths = [max(len(line[i]) for line in [heading, *body, *ending]) for i in range(len(heading))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(heading), *(line(cells) for cells in body)]
    if not body:
        out.append("(no bookings or history in this window)")
    if ending:
        out += ["  ".join("-" * w for w in widths), line(ending[0])]
    return out


def table(doc: dict) -> str:
    """The groups' table with its totals row, the projects' (a board with [[projects]]), then the verdicts."""
    days = doc['days']
    out = [f"Booked against used, {days:g} day{'' if days == 1 else 's'} to now"
           f" (used: IN USE at {doc['busy_util_pct']:g} % or more)", ""]
    out += _aligned(doc["by"], doc["rows"], doc["total"])
    out.append("")
    if "projects" in doc:
        out += ["Per project (booked: the calendar's card-hours; board projects has each budget):", *_aligned(
            "project", doc["projects"]), ""]
    if doc.get("tokens"):
        out.append("Tokens through the gateway (board usage has them by key and model):")
        out.extend(f"  {inert(str(t['user']), 32)}: {t['requests']} requests, {t['prompt_tokens']} prompt and"
                   f" {t['completion_tokens']} completion tokens" for t in doc["tokens"])
        out.append("")
    for v in doc["verdicts"]:
        out.append(f"{'!!' if v['fires'] else 'ok'}  {inert(v['message'], 400)}")
    if doc.get("tp"):
        out += ["", "Multi-card bookings: PCIe link utilisation over their busy time (traffic against the links'"
                    " capacity, not measured communication time)"]
        for g in doc["tp"]:
            said = (f"#{g['booking']} {inert(g['user'], 16)} cards {g['cards']}: {g['link_util_pct']:g} % of the links"
                    f" over {g['busy_h']:g} busy h")
            out.append(f"{'!!' if g['over'] else 'ok'}  {said}" + (f"; {g['advice']}" if g["over"] else ""))
    return "\n".join(out)


def to_csv(doc: dict) -> str:
    """A header, one row per group, the total last (key "total"); by card, each row's host after its key."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    fields = ("key", "host", *CSV_FIELDS[1:]) if doc["by"] == "card" else CSV_FIELDS  # a card's row names its host
    writer.writerow(fields)
    for r in [*doc["rows"], doc["total"]]:
        writer.writerow(["" if r.get(f) is None else r[f] for f in fields])
    return buffer.getvalue()

"""What commands print: JSON documents and plain lines, from the service's wire values (dicts, epoch seconds).

Light on purpose (datetime, and app.wire's JSON writer rather than the json package): the quick path prints through
it too. Other users' text goes through core.text.inert before it reaches a terminal; JSON escapes everything
non-ASCII.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from collections.abc import Sequence

from app.wire import document

EXIT_OK, EXIT_UNEXPECTED, EXIT_BAD_INPUT, EXIT_CONFLICT, EXIT_NOT_PERMITTED = 0, 1, 2, 3, 4


def iso(epoch: int | float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


def print_json(value: object) -> None:
    # ensure_ascii keeps other users' text inert on any terminal.
    print(document(value))


def booking_json(booking: dict | None) -> dict | None:
    """A booking as `--json` shows it: ISO times in the reader's zone."""
    if booking is None:
        return None
    return {
        "id": booking["id"],
        "user": booking["user"],
        "cards": list(booking["cards"]),
        "card_uuids": list(booking["card_uuids"]),
        "host": booking.get("host", ""),
        "start": iso(booking["start"]),
        "end": iso(booking["end"]),
        "class": booking["class"],
        "note": booking["note"],
        "status": booking["status"],
        "requested_at": iso(booking.get("requested_at") or booking["start"]),
        "queued": booking.get("queued"),
        "series_id": booking.get("series_id"),
        "notice": booking.get("notice"),
        **({"request": booking["request"]} if booking.get("request") else {}),
        **({"project": booking["project"]} if booking.get("project") else {}),  # a board with [[projects]] only
    }


def request_text(request: dict | None) -> str:
    """'mid.gguf ctx 32,768 ×4, ~2.1 GiB/card' for a booking sized from a model; '' otherwise. A row stored
    before the service checked requests may hold anything: only its well-formed fields are shown."""
    from app.core.request import readable
    from app.core.text import inert

    request = readable(request)
    if "model" not in request:
        return ""
    per_card = request.get("per_card_mib")
    estimate = f", ~{max(per_card) / 1024:.1f} GiB/card" if per_card else ""
    ctx, parallel = (f"{request[key]:,}" if key in request else "?" for key in ("ctx", "parallel"))
    return f"{inert(request['model'].rsplit('/', 1)[-1], 40)} ctx {ctx} ×{parallel}{estimate}"


def requested_mib(booking: dict | None, card: int) -> int | None:
    """What the booking's request estimated for `card`, or None."""
    from app.core.request import readable

    per_card = readable((booking or {}).get("request")).get("per_card_mib") or []
    cards = list((booking or {}).get("cards") or [])
    if card in cards and len(per_card) == len(cards):
        return per_card[cards.index(card)]
    return None


def booking_line(booking: dict, now: float | None = None, here: str | None = None) -> str:
    """One booking on one line; given `now`, each time also says how far away it is: '19:00 (in 45 min)'. Given
    `here` (this host), a booking on another host's cards names them as `--cards` does: 'cards gpu2:0-3'."""
    from app.core.text import format_cards, format_time, inert, relative

    def when(epoch: int) -> str:
        return format_time(epoch, now) + (f" ({relative(epoch, now)})" if now is not None else "")

    state = "" if booking["status"] == "booked" else f" [{booking['status']}]"
    note = f"  {inert(booking['note'], 60)}" if booking["note"] else ""
    asked = f"  [{text}]" if (text := request_text(booking.get("request"))) else ""
    queued = "  queued" if booking.get("queued") and booking["start"] > (time.time() if now is None else now) else ""
    if queued and booking.get("place"):  # its place in the queue and why (board list): app.core.fairshare.place
        queued += f" ({inert(booking['place'], 300)})"
    notice = f"  ({inert(booking['notice'], 80)})" if booking.get("notice") else ""
    series = f" (series {booking['series_id']})" if booking.get("series_id") else ""
    cards = _host_prefix(booking, here) + format_cards(booking["cards"])
    # the project beside the holder: only a board with [[projects]] has one on the wire
    holder = inert(booking["user"], 16) + (f" (project {inert(project, 40)})" if (project := booking.get("project")) else "")
    return (
        f"#{booking['id']:<5} {holder:<16} cards {cards:<15}"
        f" {when(booking['start'])} → {when(booking['end'])}  {booking['class']}{series}{state}{queued}{notice}{asked}{note}"
    )


def _host_prefix(booking: dict, here: str | None) -> str:
    """'gpu2:' for a booking on another host's cards, as `--cards gpu2:0-3` names them; '' for this host's."""
    from app.core.text import inert

    host = booking.get("host") or ""
    return f"{inert(host, 63)}:" if here is not None and host not in ("", here) else ""


def print_booking(booking: dict, verb: str, as_json: bool, now: float | None = None, here: str | None = None) -> None:
    """A confirmation: the line with how far away its times are (now defaults to the clock); --json is unchanged."""
    if as_json:
        print_json(booking_json(booking))
    else:
        print(f"{verb} {booking_line(booking, time.time() if now is None else now, here)}")


def say_notes(notes: list[str]) -> None:
    """What reading the times noticed (a wall time the clocks show twice: which was taken), on stderr."""
    for note in notes:
        print(f"board: note: {note}", file=sys.stderr)


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


# What `board status --json` leaves out of the `status` reply's cards (app.core.cardstate.status_view): the text
# table's USERS column, which the processes name.
STATUS_JSON_LEAVES_OUT = frozenset({"users"})


def status_json(found: dict) -> dict:
    """`board status --json` from the service's `status` reply."""

    def card(c: dict) -> dict:
        shown = {k: v for k, v in c.items() if k not in STATUS_JSON_LEAVES_OUT}
        shown["booking"] = booking_json(c["booking"])
        shown["next_booking"] = booking_json(c["next_booking"])
        if "down_since" in c:
            shown["down_since"] = iso(c["down_since"])
        return shown

    hosts = [{**h, "seen_at": iso(h["seen_at"])} for h in found.get("hosts", ())]
    shown = {"simulated": found["simulated"], "taken_at": iso(found["taken_at"]), "hosts": hosts,
             "cards": [card(c) for c in found["cards"]]}
    if found.get("stale_since") is not None:  # the database unreachable: the bookings as the service last read them
        shown["stale_since"] = iso(found["stale_since"])
    return shown


def host_state(card: dict, now: float) -> str | None:
    """'HOST DOWN (since 14:02)' for a card of a host whose heartbeat is late, else None."""
    if not card.get("host_down"):
        return None
    from app.core.text import format_time

    return f"HOST DOWN (since {format_time(int(card['down_since']), now)})"


def many_hosts(found: dict) -> bool:
    """Whether `board status` and `list` name hosts: only where the board knows more than one."""
    return len(found.get("hosts", ())) > 1


OVER_ASKED = 1.05  # a holder using more than this times the estimate they booked with is flagged


def status_text(found: dict, now: float) -> str:
    from app.core.text import format_time, inert

    def num(value, fmt="{}"):
        return "n/a" if value is None else fmt.format(value)

    lines = [["#", "STATE", "VRAM GiB", "ASKED", "UTIL", "TEMP", "POWER W", "HOLDER", "UNTIL", "NEXT", "USERS"]]
    for c in found["cards"]:
        used, total = c["memory_used_mib"], c["memory_total_mib"]
        vram = "n/a" if used is None or not total else f"{used / 1024:.1f}/{total / 1024:.1f}"
        booking, upcoming = c["booking"], c["next_booking"]
        asked = requested_mib(booking, c["index"])
        over = asked is not None and used is not None and used > asked * OVER_ASKED
        asked_text = "-" if asked is None else f"{asked / 1024:.1f}" + (" OVER" if over else "")
        nxt = f"{inert(upcoming['user'], 12)} {format_time(upcoming['start'], now)}" if upcoming else "-"
        lines.append([
            str(c["index"]), host_state(c, now) or " ".join([c["state"], *c["warnings"]]), vram, asked_text,
            num(c["utilization_pct"], "{}%"),
            num(c["temperature_c"], "{}°C"), f"{num(c['power_w'], '{:.0f}')}/{num(c['power_limit_w'], '{:.0f}')}",
            inert(booking["user"], 12) if booking else "-",
            format_time(booking["end"], now) if booking else "-",
            nxt, inert(",".join(c["users"]), 30) or "-",
        ])
        if c.get("host_down"):  # what its silent host last read is stale: blank, beside HOST DOWN (since ...)
            for column in (2, 4, 5, 6, 10):  # VRAM, UTIL, TEMP, POWER W, USERS
                lines[-1][column] = ""
    if any(c.get("label") for c in found["cards"]):  # in full: the board abbreviates labels to fit
        for line, c in zip(lines, [None, *found["cards"]]):
            line.insert(1, "LABEL" if c is None else inert(c.get("label") or "-", 60))
    if many_hosts(found):  # cards are named by host, as `--cards gpu2:3` names them
        for line, c in zip(lines, [None, *found["cards"]]):
            line.insert(0, "HOST" if c is None else inert(c["host"], 20))
    names = {c["name"] for c in found["cards"] if c["name"]}
    badge = " · SIMULATED" if found["simulated"] else ""
    stale = f"\n{stale_note(found, now)}" if found.get("stale_since") is not None else ""
    return f"{len(found['cards'])} × {', '.join(sorted(names)) or 'GPU'}{badge}\n{table(lines)}{stale}"


def stale_note(found: dict, now: float) -> str:
    """The line that says a reply (`status`, `list`) is the service's last read of the bookings: the database is
    unreachable (app.service.fleet.lastknown)."""
    from app.core.text import format_time

    return (f"bookings as of {format_time(found['stale_since'], now)}: the board database is unreachable;"
            " this host's cards only")


# -- series (standing slots) ---------------------------------------------------------------------


def series_json(result: dict) -> dict:
    """A series reply (series_book, series_extend, series_get, series_cancel) as `--json` shows it: ISO times."""
    def misses(key: str) -> list[dict]:
        return [{"start": iso(m["start"]), "end": iso(m["end"]), "reason": m["reason"]} for m in result.get(key, [])]

    series = result["series"]
    shown: dict = {"series": {**series, "created_at": iso(series["created_at"])}}
    for key in ("bookings", "cancelled", "running"):
        if key in result:
            shown[key] = [booking_json(b) for b in result[key]]
    for key in ("skipped", "overridden"):
        if key in result:
            shown[key] = misses(key)
    return shown


def series_line(series: dict) -> str:
    """'series 3 alice: cards 0,1,2,3 online, every weekday 09:00-19:00, 2026-12-07 to 2027-03-31  prod TP4'."""
    from app.core.series import describe
    from app.core.text import format_cards, inert

    rule = series["rule"]
    cards = rule.get("cards") if isinstance(rule.get("cards"), list) else []
    note = f"  {inert(str(rule['note']), 60)}" if rule.get("note") else ""
    cancelled = " [cancelled]" if rule.get("cancelled_at") is not None else ""
    return (f"series {series['id']} {inert(series['user'], 16)}: cards {format_cards(cards)} {rule.get('class', '?')},"
            f" {describe(rule)}{cancelled}{note}")


def print_series(result: dict, verb: str | None, as_json: bool, now: float | None = None, every_booking=False) -> None:
    """A series reply: the rule, then its bookings (those made or cancelled; only the first and last of a long
    list unless `every_booking`). The occurrences skipped or booked despite the policy, and a running one a
    cancel left alone, go to stderr as notes, one line each. `verb` None: the series as it stands (show)."""
    from app.core.text import format_time, inert

    if as_json:
        print_json(series_json(result))
        return
    now = time.time() if now is None else now
    made = result["bookings"] if "bookings" in result else result.get("cancelled", [])
    if verb is None:
        print(series_line(result["series"]))
    else:
        print(f"{verb} {series_line(result['series'])} ({len(made)} booking{'' if len(made) == 1 else 's'})")
    if every_booking or len(made) <= 3:
        print("\n".join(f"  {booking_line(b, now)}" for b in made) or "  no bookings")
    else:
        print(f"  first {booking_line(made[0], now)}\n  last  {booking_line(made[-1], now)}")
    for booking in result.get("running", []):
        print(f"board: note: booking {booking['id']} is running until {format_time(booking['end'], now)} and stays;"
              f" 'board release {booking['id']}' ends it", file=sys.stderr)
    for label, key in (("skipped", "skipped"), ("booked despite the policy", "overridden")):
        for miss in result.get(key, []):
            print(f"board: note: {label} {format_time(miss['start'], now)}: {inert(miss['reason'])}", file=sys.stderr)

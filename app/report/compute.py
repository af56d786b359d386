"""The report from rows alone (bookings, rollups, squats, faults): no service, no files, so every figure is testable.

- booked hours: each live booking's overlap with the window, times its cards;
- used hours: rollups in state IN USE (the holder's processes) with mean utilisation at or over `busy_util`;
- idle hours: rollups in state BOOKED (booked, nothing running);
- squatted hours: `squats` rows (someone else's processes on a card they had not booked), per squatter;
- utilisation: the mean of the rollups' means, weighted by their seconds (a group's while it held the card);
- wait: start - requested_at over bookings that started in the window (mean and p90, nearest rank).
A rollup's seconds are shared among the bookings that held its card during its span (5 minutes; a raw sample's
`span` is its own), by how long each held it, and the rest belongs to no booking: a booking that starts or ends
inside a bucket (one an admin split at now, say) is charged for its part, so its used and idle hours never exceed
its booked ones. Rows the service summed per booking in SQL name it (app.report.gather). A card in two pools is
one group, "a+b".
"""

from __future__ import annotations

import bisect
import math
import re
from typing import TYPE_CHECKING, Iterable

from app.core.cardstate import BOOKED, IN_USE, LOST
from app.errors import BadInput

if TYPE_CHECKING:
    from app.model import Booking

BY = ("user", "class", "pool", "card")
WEEK = 7 * 86400
MONTH = 30 * 86400
UTIL_LOW, UTIL_HIGH, WAIT_MIN, VRAM_PCT, FAULTS_MONTH, HOT_C = 30, 85, 30, 90, 3, 92
BUCKET_S = 300  # a rollup's span (app.history.store's buckets)
MAX_SINCE = 400 * 86400
NONE = "(none)"
_SINCE = re.compile(r"(\d{1,6})([hdw])")


def parse_since(text: str) -> int:
    """'30d' -> seconds: hours, days or weeks, 1 hour to 400 days."""
    found = _SINCE.fullmatch(text.strip().lower())
    seconds = int(found[1]) * {"h": 3600, "d": 86400, "w": WEEK}[found[2]] if found else 0
    if not 3600 <= seconds <= MAX_SINCE:
        raise BadInput(f"--since {text[:20]!r}: say how far back as 12h, 30d or 4w (1 hour to 400 days)")
    return seconds


def _p90(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class _Group:
    __slots__ = ("booked", "used", "idle", "squatted", "util_s", "util_sum", "waits", "bookings")

    def __init__(self) -> None:
        self.booked = self.used = self.idle = self.squatted = self.util_s = self.util_sum = 0.0
        self.waits: list[float] = []
        self.bookings: set[int] = set()

    def charge(self, part: float, state: str, busy: bool | None, util: float | None, held: bool) -> None:
        """A rollup's `part` seconds: used or idle where a booking `held` the card, and the utilisation."""
        if held:  # used and idle are a booking's; a card's utilisation is all its time
            if state == IN_USE and busy:
                self.used += part
            elif state == BOOKED:
                self.idle += part
        if util is not None:
            self.util_s += part
            self.util_sum += util * part

    def row(self, key: str) -> dict:
        hours = 3600.0
        booked = self.booked / hours
        mean, p90 = _mean(self.waits), _p90(self.waits)  # None when there is no wait
        return {
            "key": key, "bookings": len(self.bookings),
            "booked_h": round(booked, 2), "used_h": round(self.used / hours, 2), "idle_h": round(self.idle / hours, 2),
            "squatted_h": round(self.squatted / hours, 2),
            "used_pct": round(100 * self.used / self.booked, 1) if self.booked else None,
            "idle_pct": round(100 * self.idle / self.booked, 1) if self.booked else None,
            "util_mean_pct": round(self.util_sum / self.util_s, 1) if self.util_s else None,
            "wait_n": len(self.waits),
            "wait_mean_min": None if mean is None else round(mean / 60, 1),
            "wait_p90_min": None if p90 is None else round(p90 / 60, 1),
        }


def compute(bookings: Iterable, rollups: Iterable[dict], squats: Iterable[dict], faults: Iterable[dict], *,
            now: int, since_s: int, by: str = "user", busy_util: float = 10.0,
            pools: dict[str, str] | None = None, cards: dict[str, str] | None = None,
            memory_total: dict[str, int] | None = None, hosts: dict[str, str] | None = None,
            projects: bool = False) -> dict:
    """The report's document (the `--json` shape, docs/json.md, "The accounting report"). `pools`: card uuid -> pool name(s);
    `cards`: uuid -> its name in the table (e.g. "3", or "gpu2:3" in a fleet); `memory_total`: uuid -> MiB, for the VRAM
    verdict; `hosts`: uuid -> its host, which each row of `by` card carries; `projects` (a board with [[projects]]): a
    row per project too, under "projects"."""
    if by not in BY:
        raise BadInput(f"--by {by[:20]!r}: one of {', '.join(BY)}")
    pools, cards, memory_total = pools or {}, cards or {}, memory_total or {}
    start = now - since_s
    bookings = [b for b in bookings if b.status == "booked"]
    groups: dict[str, _Group] = {}

    def group(key: str) -> _Group:
        found = groups.get(key)
        if found is None:
            found = groups[key] = _Group()
        return found

    # Per project as well ([[projects]]): the same figures, whatever `by` groups the rows by.
    per_project: dict[str, _Group] | None = {} if projects else None

    def project_group(booking) -> _Group:
        assert per_project is not None
        return per_project.setdefault(booking.project or NONE, _Group())

    def key_of(booking, uuid: str) -> str:
        if by == "user":
            return booking.user if booking is not None else NONE
        if by == "class":
            return booking.klass if booking is not None else NONE
        if by == "pool":
            return pools.get(uuid, NONE)
        return cards.get(uuid, uuid)

    # Booked hours, and who held which card when (for the rollups).
    held: dict[str, list[tuple[int, int, Booking]]] = {}
    for b in bookings:
        for uuid in b.card_uuids:
            held.setdefault(uuid, []).append((b.start, b.end, b))
            overlap = min(b.end, now) - max(b.start, start)
            if overlap > 0:
                for g in (group(key_of(b, uuid)), *([project_group(b)] if per_project is not None else [])):
                    g.booked += overlap
                    g.bookings.add(b.id)
    for spans in held.values():
        spans.sort(key=lambda x: x[0])
    starts = {uuid: [s for s, _, _ in spans] for uuid, spans in held.items()}
    by_id = {b.id: b for b in bookings}

    def holder(uuid: str, ts: int):
        spans = held.get(uuid)
        if not spans:
            return None
        i = bisect.bisect_right(starts[uuid], ts) - 1
        while i >= 0:  # bookings on one card do not overlap; look back one in case they touch
            s, e, b = spans[i]
            if s <= ts < e:
                return b
            if e <= ts:
                return None
            i -= 1
        return None

    def shares(uuid: str, ts: int, span: int) -> list[tuple[Booking | None, float]]:
        """(booking or None, share) over [ts, ts + span): each booking's part of it, and no one's for the rest."""
        spans, rest = held.get(uuid) or [], 1.0
        found: list[tuple[Booking | None, float]] = []
        i = bisect.bisect_left(starts.get(uuid, ()), ts + span) - 1
        while i >= 0 and spans[i][1] > ts:  # on one card the ends are in the starts' order
            s, e, b = spans[i]
            part = (min(e, ts + span) - max(s, ts)) / span
            found.append((b, part))
            rest -= part
            i -= 1
        return found + [(None, rest)] if rest > 1e-9 else found

    # Rollups: used, idle, utilisation; fleet figures for the verdicts.
    fleet_s = fleet_util = 0.0
    dt: dict[tuple[int, str], float] = {}
    vram_s: dict[str, float] = {}
    hot_s: dict[str, float] = {}
    idle_by_user: dict[str, list[float]] = {}
    for r in rollups:
        uuid, ts, seconds, state = r["uuid"], r["ts"], r["seconds"], r["state"]
        if r["n"] and "booking_id" not in r:
            dt[(ts, uuid)] = seconds / r["n"]
        if state == LOST:
            continue
        util = r.get("util_mean")
        if util is not None:
            fleet_s += seconds
            fleet_util += util * seconds
        card_mib = memory_total.get(uuid)
        if card_mib and r.get("vram_max") is not None and r["vram_max"] >= VRAM_PCT / 100 * card_mib:
            vram_s[uuid] = vram_s.get(uuid, 0) + seconds
        if r.get("temp_max") is not None and r["temp_max"] >= HOT_C:
            hot_s[uuid] = hot_s.get(uuid, 0) + seconds
        busy = r["busy"] if "busy" in r else util is not None and util >= busy_util  # summed rows say
        # Rows summed per booking (app.report.gather) name it; a plain rollup is shared by its span.
        for b, share in ([(by_id.get(r["booking_id"]), 1.0)] if "booking_id" in r
                         else shares(uuid, ts, r.get("span", BUCKET_S))):
            part = seconds * share
            if b is not None:
                pair = idle_by_user.setdefault(b.user, [0.0, 0.0])
                pair[1] += part
                if state == BOOKED:
                    pair[0] += part
            elif by in ("user", "class"):
                continue  # an unbooked card's hours belong to no one (squats are counted below)
            group(key_of(b, uuid)).charge(part, state, busy, util, b is not None)
            if b is not None and per_project is not None:
                project_group(b).charge(part, state, busy, util, True)

    for s in squats:
        seconds = s["seconds"] if "seconds" in s else s["n"] * dt.get((s["ts"], s["uuid"]), 10.0)
        if by == "user":
            key = s["user"]
        else:
            key = key_of(holder(s["uuid"], s["ts"]), s["uuid"])
        group(key).squatted += seconds

    # Waits: bookings that started in the window.
    all_waits = []
    for b in bookings:
        if b.requested_at and start <= b.start <= now:
            wait = max(0, b.start - b.requested_at)
            all_waits.append(wait)
            keys = {key_of(b, uuid) for uuid in b.card_uuids} if by in ("pool", "card") else {key_of(b, "")}
            for key in keys:
                group(key).waits.append(wait)
            if per_project is not None:
                project_group(b).waits.append(wait)

    rows = sorted((g.row(k) for k, g in groups.items()), key=lambda r: (-r["booked_h"], r["key"]))
    if by == "card":
        host_of = {cards.get(uuid, uuid): host for uuid, host in (hosts or {}).items()}
        rows = [{"key": r["key"], "host": host_of.get(r["key"]), **r} for r in rows]
    total = _Group()
    for g in groups.values():
        for name in ("booked", "used", "idle", "squatted", "util_s", "util_sum"):
            setattr(total, name, getattr(total, name) + getattr(g, name))
        total.bookings |= g.bookings
    total.waits = all_waits
    total_row = total.row("total")
    verdicts = _verdicts(bookings, faults, now=now, since_s=since_s, util=(fleet_util / fleet_s if fleet_s else None),
                         waits=all_waits, idle_by_user=idle_by_user, vram_s=vram_s, hot_s=hot_s, cards=cards)
    doc = {"by": by, "since": start, "until": now, "days": round(since_s / 86400, 2), "busy_util_pct": busy_util,
           "rows": rows, "total": total_row, "verdicts": verdicts}
    if per_project is not None:
        doc["projects"] = sorted((g.row(k) for k, g in per_project.items()), key=lambda r: (-r["booked_h"], r["key"]))
    return doc


def waiting_at(bookings: Iterable, t: int) -> int:
    """Bookings waiting at `t`: asked for (requested_at) by then, not started."""
    return sum(1 for b in bookings if b.requested_at and b.requested_at <= t < b.start)


def _verdicts(bookings, faults, *, now, since_s, util, waits, idle_by_user, vram_s, hot_s, cards) -> list[dict]:
    days = since_s / 86400
    span = f"over {days:g} day{'s' if days != 1 else ''}"
    found = []

    def verdict(name: str, fires: bool, value, limit, message: str) -> None:
        found.append({"threshold": name, "fires": fires, "value": value, "limit": limit, "message": message})

    # Utilisation, low.
    worst = max(((user, s[0] / s[1]) for user, s in idle_by_user.items() if s[1]), key=lambda x: (x[1], x[0]),
                default=None)
    idle_note = f"; {worst[0]}'s bookings were idle {100 * worst[1]:.0f} % of their hours" if worst else ""
    if util is None:
        verdict("utilisation_low", False, None, UTIL_LOW, f"utilisation: no history {span}")
    else:
        low = util < UTIL_LOW
        verdict("utilisation_low", low, round(util, 1), UTIL_LOW,
                f"utilisation {util:.0f} % {span} (< {UTIL_LOW} %): the cards are cut too fine or booked and idle"
                + idle_note if low else f"utilisation {util:.0f} % {span} (not under {UTIL_LOW} %)")

    # Utilisation, high, with a growing queue.
    queued_now, queued_before = waiting_at(bookings, now), waiting_at(bookings, now - WEEK)
    recent = [b.start - b.requested_at for b in bookings if b.requested_at and now - WEEK < b.start <= now]
    earlier = [b.start - b.requested_at for b in bookings if b.requested_at and now - 2 * WEEK < b.start <= now - WEEK]
    mean_recent, mean_earlier = _mean(recent), _mean(earlier)
    rising = mean_recent is not None and mean_earlier is not None and mean_recent > mean_earlier
    growing = queued_now > queued_before or rising
    queue = (f"{queued_now} waiting now against {queued_before} a week ago; mean wait "
             f"{_minutes(mean_recent)} this week against {_minutes(mean_earlier)} the week before")
    high = util is not None and util > UTIL_HIGH and growing
    verdict("utilisation_high", high, None if util is None else round(util, 1), UTIL_HIGH,
            (f"utilisation {util:.0f} % {span} (> {UTIL_HIGH} %) with a growing queue ({queue}): buy cards or cap"
             " the bookings" if high else
             f"utilisation {'-' if util is None else f'{util:.0f} %'} (high is over {UTIL_HIGH} % with a growing"
             f" queue; {queue})"))

    # Wait.
    mean = _mean(waits)
    slow = mean is not None and mean > WAIT_MIN * 60
    verdict("wait", slow, None if mean is None else round(mean / 60, 1), WAIT_MIN,
            f"mean wait {_minutes(mean)} over {len(waits)} booking{'s' if len(waits) != 1 else ''} (p90 "
            f"{_minutes(_p90(waits))}) {span}" + (f" (> {WAIT_MIN} min): too few cards for the queue" if slow else
                                                  f" (not over {WAIT_MIN} min)"))

    # VRAM, faults, heat.
    def cards_hours(seconds: dict[str, float]) -> str:
        names = sorted(seconds, key=lambda u: (-seconds[u], cards.get(u, u)))
        return ", ".join(f"card {cards.get(u, u)} {seconds[u] / 3600:.1f} h" for u in names)

    vram_h = round(sum(vram_s.values()) / 3600, 2)
    verdict("vram", bool(vram_s), vram_h, VRAM_PCT,
            f"VRAM at or over {VRAM_PCT} % for {vram_h:g} card-hours {span} ({cards_hours(vram_s)}): jobs are near"
            " out of memory; book bigger cards or more of them" if vram_s else
            f"VRAM never at or over {VRAM_PCT} % {span}")
    counted = [f for f in faults if f["kind"] in ("xid", "oom") and now - since_s <= f["ts"] < now]
    per_month = len(counted) * MONTH / since_s
    kinds = {k: sum(1 for f in counted if f["kind"] == k) for k in ("xid", "oom")}
    many = per_month > FAULTS_MONTH
    verdict("faults", many, round(per_month, 2), FAULTS_MONTH,
            f"{kinds['oom']} OOM and {kinds['xid']} Xid faults {span}, {per_month:.1f} a month"
            + (f" (> {FAULTS_MONTH}): a card or its jobs are failing; see board faults" if many else
               f" (not over {FAULTS_MONTH})"))
    hot_h = round(sum(hot_s.values()) / 3600, 2)
    verdict("temperature", bool(hot_s), hot_h, HOT_C,
            f"cards at {HOT_C} °C or more for {hot_h:g} card-hours {span} ({cards_hours(hot_s)}): check the airflow"
            if hot_s else f"no card at {HOT_C} °C {span}")
    return found


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.0f} min"

"""The `report` operation: read the rows (bookings and faults from board.db, rollups and squats from the history)
and hand them to app.report.compute. Read-only: a history file that is not there is not made."""

from __future__ import annotations

import bisect
import json
import sqlite3
from collections.abc import Sequence

from app.config import Config
from app.errors import BadInput
from app.faults import store as fault_rows
from app.gpu.model import CardReading
from app.history.energy import energy_report
from app.history.store import (BUCKET_S, CARD_BITS, CARD_MASK, DAY_BUCKETS, EPOCH, SLOT_BITS, STATES, SUM_BITS,
                               HistoryStore, _bucket_id)
from app.report.compute import HOT_C, MAX_SINCE, VRAM_PCT, compute
from app.store import bookings as rows
from app.store import keys as key_rows
from app.store.db import is_postgres

FOREVER = 2**62
# One pass over the window's rollups, each given to the booking that held its card for the whole bucket (the
# latest span in `report_held` starting at or before it on that card, if it has not ended), summed per booking,
# card, state and what the verdicts test (busy, VRAM at 90 %, 92 °C): seconds, samples, the utilisation's sum and
# seconds, the most VRAM and heat. Each group is on one side of every threshold, so its sums answer exactly what
# the rollups one by one would. Read by bucket, a booking's span would read every card's rows (they interleave).
# The group is one integer (what GROUP BY sorts fastest): booking << 17 | hot, full, busy (2 bits each: 0, 1, or
# 2 for unknown) | state (3 bits) | card (8 bits); `key` takes it apart.
HELD = f"""
    coalesce((SELECT CASE WHEN h.hi > (r.id >> {CARD_BITS}) THEN h.booking END FROM temp.report_held h
              WHERE h.card = (r.id & {CARD_MASK}) AND h.lo <= (r.id >> {CARD_BITS}) ORDER BY h.lo DESC LIMIT 1), 0)"""
SUMS = f"""
    sum({{share}} r.n * r.dt), sum({{share}} r.n),
    sum((r.util_min + r.util_mean_d) * {{share}} r.n * r.dt), sum(CASE WHEN r.util_min IS NOT NULL
        THEN {{share}} r.n * r.dt END),
    max(r.vram_min + r.vram_max_d), max(r.temp_min + r.temp_max_d), min(r.id >> {CARD_BITS})"""
FLAGS = f"""
    (r.id & {CARD_MASK}) | (r.state << {CARD_BITS}) | (coalesce((r.util_min + r.util_mean_d) >= ?, 2) << 11)
    | (coalesce((r.vram_min + r.vram_max_d) * 100 >= {VRAM_PCT} * ({{memory}}), 2) << 13)
    | (coalesce((r.temp_min + r.temp_max_d) >= {HOT_C}, 2) << 15)"""
# The rollups that day_sums does not answer for (days not summed, stretches a booking held in part): id ranges,
# of one card or (card -1) all.
WHOLE = f"""
    SELECT ({HELD} << 17) | {FLAGS} AS k, {SUMS.format(share="")}
    FROM temp.report_ranges g JOIN rollups r ON r.id >= g.lo AND r.id < g.hi
    WHERE g.card < 0 OR (r.id & {CARD_MASK}) = g.card GROUP BY k"""
# The buckets a booking held in part: each rollup read once, its sums scaled by the share.
PARTS = f"""
    SELECT (p.booking << 17) | {FLAGS} AS k, {SUMS.format(share="p.share *")}
    FROM temp.report_parts p JOIN rollups r ON r.id = p.id GROUP BY k"""
SQUATS = f"""
    SELECT ((s.id >> {SLOT_BITS + CARD_BITS}) * {BUCKET_S} + {EPOCH}), c.uuid, s.user, s.n, s.n * coalesce(r.dt, 10)
    FROM squats s JOIN cards c ON c.id = ((s.id >> {SLOT_BITS}) & {CARD_MASK})
    LEFT JOIN rollups r ON r.id = (s.id >> {SLOT_BITS})
    WHERE s.id >= ? AND s.id < ?"""


def report_reply(conn: sqlite3.Connection, history: HistoryStore, config: Config, cards_now: Sequence[CardReading],
                 now: float, since_s: int, by: str) -> dict:
    """The report over the `since_s` seconds up to `now`, by user, class, pool or card; `cards_now` are the fleet's
    cards as read now (their index and VRAM, where the history has none)."""
    if not 3600 <= since_s <= MAX_SINCE:
        raise BadInput(f"report: since_s is 3600 to {MAX_SINCE}")
    now = int(now)
    start = now - since_s
    # Two weeks back at least: the high-utilisation verdict compares this week's waits with the last one's.
    bookings = rows.live_between(conn, min(start, now - 14 * 86400), FOREVER)
    faults = [{"ts": f.ts, "kind": f.kind} for f in fault_rows.recent(conn, start) if f.ts < now]
    rollups: list[dict] = []
    squats: list[dict] = []
    memory_total: dict[str, int] = {}
    cards: dict[str, str] = {}
    hosts: dict[str, str] = {}  # card uuid -> its host ('' for this one's)
    local_from = start  # where this host's rollups are read from its history file
    fleet = is_postgres(conn)
    if fleet:
        # The fleet: every host's rollups from the store, and this host's not written there yet from its file.
        from app.history.fleet import store_mark  # start-up: only a PostgreSQL store's report reads the fleet's

        here = config.fleet_host
        mark = store_mark(conn, here)
        local_from = start if mark is None else max(start, min(now, mark + BUCKET_S))
        squats = fleet_squats(conn, start, local_from, here) + fleet_squats(conn, start, now, None, not_host=here)
        readings = fleet_cards(conn, here, cards, hosts, memory_total)
    if history.path.exists():
        store = history
        for uuid, idx, total in store.conn.execute("SELECT uuid, idx, memory_total FROM cards"):
            if idx is not None:
                cards[uuid] = str(idx)
            if total:
                memory_total[uuid] = total
        # Rollups up to where they end, summed per booking in SQL (a year is 841 k of them), then the raw
        # samples (the last minutes, not rolled up yet), each as a one-sample rollup: finer data where it exists.
        rolled = max(local_from, min(now, store.rolled_to() or local_from))
        rollups += summed_rollups(store, local_from, rolled, bookings, config.report.busy_util)
        squats += [{"ts": ts, "uuid": uuid, "user": user, "n": n, "seconds": seconds} for ts, uuid, user, n, seconds in
                   store.conn.execute(SQUATS, [_bucket_id(local_from, 0) << SLOT_BITS,
                                               _bucket_id(rolled, 0) << SLOT_BITS])]
        for s in store.samples(rolled, now):
            rollups.append({"ts": s["ts"], "uuid": s["uuid"], "n": 1, "seconds": s["dt"], "span": s["dt"], "state": s["state"],
                            "util_mean": s["util"], "vram_max": s["vram"], "temp_max": s["temp"]})
            squats.extend({"ts": s["ts"], "uuid": s["uuid"], "user": u["user"], "n": 1} for u in s["users"] if u["squat"])
    for card in cards_now:
        cards[card.uuid] = str(card.index)
        if card.memory_total_mib:  # as fleet_cards: a card that cannot say has no figure (None or 0 read alike)
            memory_total.setdefault(card.uuid, card.memory_total_mib)
    if fleet:  # summed in the database, with the VRAM each card is judged by (so: once memory_total is whole)
        rollups[:0] = fleet_sums(conn, start, {config.fleet_host: local_from}, now, bookings, config.report.busy_util,
                                 memory_total)
    for b in bookings:
        for index, uuid in zip(b.cards, b.card_uuids):
            cards.setdefault(uuid, str(index))
            hosts.setdefault(uuid, "" if b.host == config.fleet_host else b.host)
    pools: dict[str, str] = {}
    for uuid, name in cards.items():
        names = [p.name for p in config.pools if not hosts.get(uuid) and name.isdigit() and int(name) in p.cards]
        if names:
            pools[uuid] = "+".join(names)
    here = config.fleet_host
    hosts = {uuid: hosts.get(uuid) or here for uuid in cards}
    if len(set(hosts.values())) > 1:  # the fleet: each card named with its host, as --cards names them
        cards = {uuid: f"{hosts[uuid]}:{name}" for uuid, name in cards.items()}
    doc = compute(bookings, rollups, squats, faults, now=now, since_s=since_s, by=by,
                  busy_util=config.report.busy_util, pools=pools, cards=cards, memory_total=memory_total, hosts=hosts,
                  projects=bool(config.projects))
    # The gateway's requests and tokens per user in the same window (board usage has them by key and model).
    doc["tokens"] = [{"user": user, "requests": n, "prompt_tokens": p, "completion_tokens": c}
                     for user, (n, p, c) in sorted(key_rows.tokens_by_user(conn, start, now).items(),
                                                   key=lambda item: (-(item[1][1] + item[1][2]), item[0]))]
    doc["tp"] = tp_links(history, bookings, cards_now, start, now, config.report.busy_util) \
        if history.path.exists() else []
    if fleet:  # other hosts' multi-card bookings, from their rollups in the store
        doc["tp"] += fleet_tp_links(conn, bookings, readings, config.fleet_host, start, now, config.report.busy_util)
        order = {b.id: i for i, b in enumerate(bookings)}
        doc["tp"].sort(key=lambda g: order[g["booking"]])
    # What the bookings' cards drew while they held them (this host's history file).
    doc["energy"] = energy_report(history, bookings, start, now, projects=bool(config.projects))
    return doc


# The store's rollups summed as summed_rollups sums the history file's (what compute takes, the same figures), in one
# pass: each rollup's place among the bookings' spans on its card is found by width_bucket over one sorted array of
# (card << 40 | time) bounds, so neither the rollups nor a join per rollup leave the database. A region is a booking's
# whole buckets on a card (label: its id), a bucket that bookings hold in part (-1: that rollup comes back as it is,
# for compute to share, as it shares a raw one), or no booking's (0).
FLEET_SUMS = """
    SELECT coalesce(label, 0), CASE WHEN label < 0 THEN w END, card_uuid, state, busy, "full", hot,
           sum(n * dt), sum(n), sum(util * n * dt), sum(CASE WHEN util IS NOT NULL THEN n * dt END), max(util),
           max(vram), max(temp), min(ts)
    FROM (SELECT r.*, u.label,
                 r.util_min + r.util_mean_d AS util, r.vram_min + r.vram_max_d AS vram, r.temp_min + r.temp_max_d AS temp,
                 coalesce((r.util_min + r.util_mean_d >= ?::float8)::int, 2) AS busy,
                 CASE WHEN m.total > 0 THEN coalesce((r.vram_min + r.vram_max_d >= ?::float8 * m.total)::int, 2)
                      ELSE 2 END AS "full",
                 coalesce((r.temp_min + r.temp_max_d >= ?)::int, 2) AS hot, u.w
          FROM rollups r
          LEFT JOIN unnest(?::text[], ?::bigint[]) AS m(uuid, total) ON m.uuid = r.card_uuid
          LEFT JOIN LATERAL (SELECT width_bucket((array_position(?::text[], r.card_uuid)::bigint << 40) | r.ts,
                                                 ?::bigint[]) AS w) AS p ON true
          LEFT JOIN LATERAL (SELECT p.w, (?::bigint[])[p.w + 1] AS label) AS u ON true
          WHERE r.ts >= ? AND r.ts < {until}) AS x
    GROUP BY 1, 2, 3, 4, 5, 6, 7"""


def fleet_sums(conn, start: int, ends: dict[str, int], end: int, bookings, busy_util: float,
               memory_total: dict[str, int]) -> list[dict]:
    """The store's rollups of buckets starting in [start, end) (a host in `ends`: up to its own end) as compute takes
    them, summed per booking, card, state and what the verdicts test (summed_rollups' rows), a bucket held in part
    as its rollup; `memory_total` is the VRAM compute judges each card's by."""
    def bucket(ts: int) -> int:  # the start of the bucket holding ts
        return (ts - EPOCH) // BUCKET_S * BUCKET_S + EPOCH

    order = sorted({u for b in bookings for u in b.card_uuids})
    number = {uuid: i + 1 for i, uuid in enumerate(order)}  # as array_position counts
    regions: dict[int, tuple[int, int]] = {}  # its first key -> (its end key, its label)
    for b in bookings:
        if b.status != "booked":
            continue
        first, last = -(-(b.start - EPOCH) // BUCKET_S) * BUCKET_S + EPOCH, bucket(b.end)  # the whole buckets
        shared = [t for t in {bucket(b.start), bucket(b.end - 1)}
                  if 0 < min(b.end, t + BUCKET_S) - max(b.start, t) < BUCKET_S]
        for uuid in b.card_uuids:
            card = number[uuid] << 40
            if last > first:
                regions[card | first] = (card | last, b.id)
            for t in shared:
                regions[card | t] = (card | t + BUCKET_S, -1)
    bounds, labels, at = [], [0], None
    for lo in sorted(regions):
        hi, label = regions[lo]
        if at is not None and lo > at:
            bounds.append(at)
            labels.append(0)
        bounds.append(lo)
        labels.append(label)
        at = hi
    if at is not None:
        bounds.append(at)
        labels.append(0)
    known = [(uuid, total) for uuid, total in memory_total.items() if total]
    until = f"CASE r.host {' '.join('WHEN ? THEN ?' for _ in ends)} ELSE ? END" if ends else "?"
    args = [busy_util, VRAM_PCT / 100, HOT_C, [u for u, _ in known], [t for _, t in known], order, bounds, labels,
            start, *(x for pair in ends.items() for x in pair), end]
    found = []
    for (label, _region, uuid, state, busy, full, hot, seconds, n, util_sum, util_s, util, vram, temp, ts
         ) in conn.execute(FLEET_SUMS.format(until=until), args):
        if label < 0:  # one rollup: compute shares it among the bookings that held its bucket in part
            found.append({"ts": ts, "uuid": uuid, "n": n, "seconds": seconds, "span": BUCKET_S,
                          "state": STATES[state], "util_mean": util, "vram_max": vram, "temp_max": temp})
            continue
        flags = tuple(None if f == 2 else f for f in (busy, full, hot))
        found.append({"uuid": uuid, "state": STATES[state], "seconds": seconds, "n": n,
                      "util_mean": None if not util_s else util_sum / util_s, "vram_max": vram, "temp_max": temp,
                      "ts": ts, "busy": flags[0], "flags": flags, "booking_id": label or None})
    return found


def fleet_squats(conn, start: int, end: int, host: str | None, *, not_host: str | None = None) -> list[dict]:
    """The store's squats of buckets starting in [start, end), of `host` (or of every host but `not_host`), as compute
    takes them (app.history.fleet writes them): a row per squatted bucket, card and user."""
    if end <= start:
        return []
    where, args = ("host = ?", [host]) if host is not None else ("host != ?", [not_host])
    return [{"ts": ts, "uuid": uuid, "user": user, "n": n, "seconds": n * (dt or 10)}
            for ts, uuid, user, n, dt in conn.execute(
                'SELECT s.ts, s.card_uuid, s."user", s.n, r.dt FROM rollup_squats s LEFT JOIN rollups r'
                " ON r.host = s.host AND r.card_uuid = s.card_uuid AND r.ts = s.ts"
                f" WHERE s.ts >= ? AND s.ts < ? AND s.{where} ORDER BY s.ts", [start, end, *args])]


def fleet_cards(conn, here: str, cards: dict[str, str], hosts: dict[str, str], memory_total: dict[str, int]
                ) -> dict[str, CardReading]:
    """Every host's cards from the store (index and host) and their VRAM from each host's last snapshot, into the
    dicts given; this host's cards' host is ''. Returns the other hosts' cards as their last snapshots read them."""
    from app.gpu.model import snapshot_from_wire
    from app.store import hosts as host_rows

    for uuid, idx, host in conn.execute("SELECT uuid, idx, host FROM cards"):
        cards[uuid] = str(idx)
        hosts[uuid] = "" if host == here else host
    readings = {}
    for row in host_rows.all_hosts(conn):
        try:
            snapshot = snapshot_from_wire(json.loads(row.snapshot))
        except (ValueError, TypeError, KeyError):  # a row that does not decode: its cards' VRAM is not known
            continue
        for card in snapshot.cards:
            if card.memory_total_mib:
                memory_total.setdefault(card.uuid, card.memory_total_mib)
            if row.host != here:
                readings[card.uuid] = card
    return readings


TP_SHARE_PCT = 25.0  # the seeds: when communication takes more than 25 % of a TP group's time, it is too wide


def tp_advice(cards: int) -> str:
    """What a group over the share should do: a smaller TP among TP2 and TP4 (the seeds' sweet spot without NVLink)
    that is smaller than the group itself, else (a pair) split by layers or use one card."""
    smaller = " or ".join(f"TP{n}" for n in (2, 4) if n < cards)
    if not smaller:
        return ("over the seeds' 25 %: PCIe is the pair's bottleneck; split by layers (--split-mode layer), or use one"
                " card where the model fits")
    return (f"over the seeds' 25 %: the group is too wide for PCIe; use a smaller TP ({smaller}) or split by layers"
            " (--split-mode layer)")


def tp_links(store: HistoryStore, bookings, cards_now: Sequence[CardReading], start: int, now: int,
             busy_util: float) -> list[dict]:
    """Per multi-card booking in the window: its cards' PCIe traffic as a share of their links' capacity, over the
    time it was busy (IN USE at `busy_util` % or more). Link utilisation, not measured communication time: a group
    that moves its weights in counts too, so it is a hint that points at the groups worth a look."""
    ids, in_use = store.cards(), STATES.index("IN USE")
    capacity = _link_capacity(cards_now)
    rolled = max(start, min(now, store.rolled_to() or start))
    found = []
    for b in bookings:
        lo, hi = max(start, b.start), min(now, b.end)
        held = [ids[u] for u in b.card_uuids if u in ids]
        if len(b.card_uuids) < 2 or hi <= lo or not held or not all(u in capacity for u in b.card_uuids):
            continue
        cards = ", ".join(str(int(c)) for c in held)
        seconds, traffic = store.conn.execute(
            f"SELECT sum(n * dt), sum(pcie_mean * n * dt) FROM rollups WHERE id >= ? AND id < ?"
            f" AND (id & {CARD_MASK}) IN ({cards}) AND state = ? AND util_min + util_mean_d >= ?"
            f" AND pcie_mean IS NOT NULL",
            [_bucket_id(lo, 0), _bucket_id(min(hi, rolled), 0), in_use, busy_util]).fetchone() if rolled > lo \
            else (None, None)
        raw_seconds, raw_traffic = store.conn.execute(
            f"SELECT sum(dt), sum(pcie * dt) FROM samples WHERE id >= ? AND id < ? AND (id & {CARD_MASK}) IN ({cards})"
            f" AND state = ? AND util >= ? AND pcie IS NOT NULL",
            [(max(lo, rolled) - EPOCH) << CARD_BITS, (hi - EPOCH) << CARD_BITS, in_use, busy_util]).fetchone()
        seconds, traffic = (seconds or 0) + (raw_seconds or 0), (traffic or 0) + (raw_traffic or 0)
        if not seconds:
            continue
        found.append(_tp_group(b, seconds, traffic, capacity))
    return found


def fleet_tp_links(conn, bookings, readings: dict[str, CardReading], here: str, start: int, now: int,
                   busy_util: float) -> list[dict]:
    """tp_links for the multi-card bookings on other hosts' cards, from their rollups in the store (its `pcie_mean`)
    and the links their last snapshots read (`readings`); their cards are named with their host (`gpu2:0-1`). The
    store has no raw samples: a host's last minutes count once its rollups reach it."""
    capacity, in_use = _link_capacity(readings.values()), STATES.index("IN USE")

    def bucket(ts: int) -> int:  # the start of the bucket holding ts, as tp_links reads a bucket id
        return (ts - EPOCH) // BUCKET_S * BUCKET_S + EPOCH

    found = []
    for b in bookings:
        lo, hi = max(start, b.start), min(now, b.end)
        if b.host == here or len(b.card_uuids) < 2 or hi <= lo or not all(u in capacity for u in b.card_uuids):
            continue
        seconds, traffic = conn.execute(
            "SELECT sum(n * dt), sum(pcie_mean * n * dt) FROM rollups WHERE host = ? AND card_uuid = ANY(?)"
            " AND ts >= ? AND ts < ? AND state = ? AND util_min + util_mean_d >= ? AND pcie_mean IS NOT NULL",
            [b.host, list(b.card_uuids), bucket(lo), bucket(hi), in_use, busy_util]).fetchone()
        if seconds:
            found.append(_tp_group(b, seconds, traffic or 0, capacity, host=b.host))
    return found


def _link_capacity(cards) -> dict[str, float]:
    """Each card's PCIe link capacity (MiB/s) by uuid, where its reading says it."""
    from app.gpu.model import running_link_mib_s

    capacity: dict[str, float] = {}
    for card in cards:
        if (found := running_link_mib_s(card)) is not None:
            capacity[card.uuid] = found
    return capacity


def _tp_group(b, seconds: float, traffic: float, capacity: dict[str, float], host: str | None = None) -> dict:
    """A multi-card booking's line in `tp`: its traffic as a share of its links' capacity over its busy time."""
    from app.core.hardware import card_list

    link = sum(capacity[u] for u in b.card_uuids) / len(b.card_uuids)
    share = 100 * traffic / seconds / link
    return {"booking": b.id, "user": b.user, "cards": (f"{host}:" if host else "") + card_list(b.cards),
            "busy_h": round(seconds / len(b.card_uuids) / 3600, 2), "link_util_pct": round(share, 1),
            "over": share > TP_SHARE_PCT, "advice": tp_advice(len(b.card_uuids)) if share > TP_SHARE_PCT else None}


def summed_rollups(store, start: int, end: int, bookings, busy_util: float) -> list[dict]:
    """The rollups over [start, end) as compute takes them, summed: per booking and card while it held the card
    (a bucket it held in part counts for that part, as compute shares a rollup), and the rest per card. The summed
    days' stretches (day_sums) that one booking or none held whole count as they are; the rest of the window's
    rollups are read in one pass (WHOLE), and each bucket held in part once more (PARTS)."""
    if end <= start:
        return []
    db, cards = store.conn, store.cards()

    def bucket(ts: int) -> int:  # the first bucket starting at or after ts
        return -(-(ts - EPOCH) // BUCKET_S)

    lo, hi = bucket(start), bucket(end)  # buckets starting in [start, end)
    held: list[tuple[int, int, int, int]] = []  # (card, first bucket, last bucket, booking): report_held's rows
    parts: list[tuple[int, int, float]] = []  # (bucket << CARD_BITS | card, booking, share): report_parts' rows
    for b in bookings:
        first, last = max(lo, bucket(b.start)), min(hi, (b.end - EPOCH) // BUCKET_S)  # the buckets wholly inside
        partial = []
        for k in sorted({(b.start - EPOCH) // BUCKET_S, (b.end - 1 - EPOCH) // BUCKET_S}):
            begin = k * BUCKET_S + EPOCH
            part = min(b.end, begin + BUCKET_S) - max(b.start, begin)
            if lo <= k < hi and 0 < part < BUCKET_S:
                partial.append((k, part / BUCKET_S))
        for uuid in b.card_uuids:
            card = cards.get(uuid)
            if card is None:
                continue
            if last > first:
                held.append((card, first, last, b.id))
            parts.extend(((k << CARD_BITS) | card, b.id, share) for k, share in partial)
    # Each card's VRAM in the SQL itself: a join per rollup would cost more than the sums.
    memory = " ".join(f"WHEN {int(card)} THEN {int(total)}" for card, total in
                      db.execute("SELECT id, memory_total FROM cards WHERE memory_total IS NOT NULL"))
    memory = f"CASE r.id & {CARD_MASK} {memory} ELSE {1 << 40} END" if memory else str(1 << 40)
    uuids = {card: uuid for uuid, card in cards.items()}
    db.execute("CREATE TEMP TABLE IF NOT EXISTS report_held (card INTEGER, lo INTEGER, hi INTEGER, booking INTEGER,"
               " PRIMARY KEY (card, lo)) WITHOUT ROWID")
    db.execute("CREATE TEMP TABLE IF NOT EXISTS report_parts (id INTEGER, booking INTEGER, share REAL)")
    db.execute("CREATE TEMP TABLE IF NOT EXISTS report_ranges (lo INTEGER, hi INTEGER, card INTEGER)")
    begun = not db.in_transaction  # one snapshot: the sampler's summing or pruning commits whole days meanwhile
    if begun:
        db.execute("BEGIN")
    try:
        summed, ranges = _day_sums(db, lo, hi, held, busy_util)
        # bookings on one card do not overlap, so neither do their whole buckets
        db.executemany("INSERT OR IGNORE INTO temp.report_held VALUES (?, ?, ?, ?)", held)
        db.executemany("INSERT INTO temp.report_parts VALUES (?, ?, ?)", parts)
        db.executemany("INSERT INTO temp.report_ranges VALUES (?, ?, ?)", ranges)
        for sums_row in db.execute(WHOLE.format(memory=memory), [busy_util]):
            _add(summed, *sums_row)
        whole = [(k, *summed[k]) for k in sorted(summed)]  # in key order, as GROUP BY gives them
        shared = db.execute(PARTS.format(memory=memory), [busy_util]).fetchall()
    finally:
        db.execute("DELETE FROM temp.report_held")
        db.execute("DELETE FROM temp.report_parts")
        db.execute("DELETE FROM temp.report_ranges")
        if begun:
            db.execute("COMMIT")

    def flag(bits: int) -> int | None:
        return None if bits == 2 else bits

    def row(k, seconds, n, util_sum, util_s, vram, temp, first) -> dict:
        busy, full, hot = flag(k >> 11 & 3), flag(k >> 13 & 3), flag(k >> 15 & 3)
        return {"uuid": uuids[k & CARD_MASK], "state": STATES[k >> CARD_BITS & 7], "seconds": seconds, "n": n,
                "util_mean": None if not util_s else util_sum / util_s, "vram_max": vram, "temp_max": temp,
                "ts": first * BUCKET_S + EPOCH, "busy": busy, "flags": (busy, full, hot), "booking_id": k >> 17 or None}

    # (a card missing from the history's cards table is no one's: as the join it replaces)
    whole = [r for r in whole if r[0] & CARD_MASK in uuids]
    shared = [r for r in shared if r[0] & CARD_MASK in uuids]
    found = [row(*r) for r in whole if r[0] >> 17] + [row(*r) for r in shared]
    # What no booking held: a card's unheld whole buckets, less the parts of its buckets that bookings held.
    booked: dict[tuple, list] = {}
    for r in shared:
        sums = booked.setdefault(_key(row(*r)), [0.0, 0.0, 0.0])
        sums[0] += r[1]
        sums[1] += r[2]
        sums[2] += r[3] or 0.0
    for r in whole:
        if r[0] >> 17:
            continue
        free = row(*r)
        sums = booked.get(_key(free), [0, 0, 0.0])
        seconds = free["seconds"] - sums[0]
        if seconds <= 1e-6:  # all of it was booked (shares are fractions: allow their rounding)
            continue
        util = None if free["util_mean"] is None else ((r[3] or 0.0) - sums[2]) / seconds
        found.append({**free, "seconds": seconds, "n": free["n"] - sums[1], "util_mean": util})
    return found


def _day_sums(db, lo: int, hi: int, held: list[tuple], busy_util: float) -> tuple[dict[int, list], list[tuple]]:
    """The buckets [lo, hi) from day_sums where it answers: WHOLE's sums per key (each stretch given to the
    booking that held its card for all of it, or to none), and the id ranges left for WHOLE to read (lo, hi,
    card)."""
    whole_days = range(-(-lo // DAY_BUCKETS), hi // DAY_BUCKETS)
    days = sorted(d for d, in db.execute("SELECT day FROM summed_days WHERE busy_util = ? AND day >= ? AND day < ?",
                                         [busy_util, whole_days.start, whole_days.stop]))
    spans: dict[int, dict[int, tuple[int, int]]] = {}
    for card, first, last, booking in held:  # as temp.report_held keeps them (the first at a start)
        spans.setdefault(card, {}).setdefault(first, (last, booking))
    starts = {card: sorted(found) for card, found in spans.items()}

    def holder(card: int, first: int, last: int) -> int | None:
        """The booking that held the card for all the buckets [first, last] (0: none did), or None if that
        changed in between."""
        los = starts.get(card, ())
        i = bisect.bisect_right(los, first) - 1
        if i + 1 < len(los) and los[i + 1] <= last:
            return None
        if i < 0:
            return 0
        end, booking = spans[card][los[i]]
        return booking if end > last else 0 if end <= first else None

    found: dict[int, list] = {}
    ranges, rest, at, low = [], set(), lo, (1 << SUM_BITS) - 1
    for begin, end in _runs(days):
        if begin * DAY_BUCKETS > at:
            ranges.append((at << CARD_BITS, begin * DAY_BUCKETS << CARD_BITS, -1))
        at = end * DAY_BUCKETS
        for key, span, n, seconds, util_sum, util_s, vram, temp in db.execute(
                "SELECT id, span, n, seconds, util_sum, util_s, vram_max, temp_max FROM day_sums WHERE id >= ?"
                " AND id < ?", [begin * DAY_BUCKETS << SUM_BITS, end * DAY_BUCKETS << SUM_BITS]):
            first, card = key >> SUM_BITS, key & CARD_MASK
            booking = holder(card, first, first + span - 1)
            if booking is None:
                rest.add((first << CARD_BITS, first + span << CARD_BITS, card))
            else:
                _add(found, booking << 17 | key & low, seconds, n, util_sum, util_s, vram, temp, first)
    if hi > at:
        ranges.append((at << CARD_BITS, hi << CARD_BITS, -1))
    return found, ranges + sorted(rest)


def _add(found: dict[int, list], k: int, seconds, n, util_sum, util_s, vram, temp, first) -> None:
    """One of WHOLE's rows added into `found` (as GROUP BY would: sums added, NULL where all were, the most the
    most, the first the first)."""
    mine = found.get(k)
    if mine is None:
        found[k] = [seconds, n, util_sum, util_s, vram, temp, first]
        return
    mine[0] += seconds
    mine[1] += n
    if util_sum is not None:
        mine[2] = util_sum if mine[2] is None else mine[2] + util_sum
    if util_s is not None:
        mine[3] = util_s if mine[3] is None else mine[3] + util_s
    if vram is not None and (mine[4] is None or vram > mine[4]):
        mine[4] = vram
    if temp is not None and (mine[5] is None or temp > mine[5]):
        mine[5] = temp
    if first < mine[6]:
        mine[6] = first


def _runs(days: list[int]) -> list[tuple[int, int]]:
    """Consecutive days as [begin, end) runs."""
    found: list[tuple[int, int]] = []
    for day in days:
        if found and found[-1][1] == day:
            found[-1] = (found[-1][0], day + 1)
        else:
            found.append((day, day + 1))
    return found


def _key(row: dict) -> tuple:
    return row["uuid"], row["state"], row["flags"]

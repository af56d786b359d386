"""The `report` operation: read the rows (bookings and faults from board.db, rollups and squats from the history)
and hand them to app.report.compute. Read-only: a history file that is not there is not made."""

from __future__ import annotations

from app.report.compute import MAX_SINCE, compute

FOREVER = 2**62


def report_reply(service, since_s: int, by: str) -> dict:
    from app.errors import BadInput
    from app.store import bookings as rows

    if not 3600 <= since_s <= MAX_SINCE:
        raise BadInput(f"report: since_s is 3600 to {MAX_SINCE}")
    now = int(service.clock())
    start = now - since_s
    # Two weeks back at least: the high-utilisation verdict compares this week's waits with the last one's.
    bookings = rows.live_between(service.conn, min(start, now - 14 * 86400), FOREVER)
    faults = [{"ts": ts, "kind": kind} for ts, kind in service.conn.execute(
        "SELECT ts, kind FROM faults WHERE ts >= ? AND ts < ?", [start, now])]
    rollups: list[dict] = []
    squats: list[dict] = []
    memory_total: dict[str, int] = {}
    cards: dict[str, str] = {}
    if service.config.history_path.exists():
        from app.history.sampler import history_store

        store = history_store(service)
        # Rollups up to where they end, then the raw samples (the last minutes, not rolled up yet), each as a
        # one-sample rollup: finer data where it exists.
        rolled = max(start, min(now, store.rolled_to() or start))
        rollups = store.rollups(start, rolled)
        squats = store.squats(start, rolled)
        for s in store.samples(rolled, now):
            rollups.append({"ts": s["ts"], "uuid": s["uuid"], "n": 1, "seconds": s["dt"], "state": s["state"],
                            "util_mean": s["util"], "vram_max": s["vram"], "temp_max": s["temp"]})
            squats.extend({"ts": s["ts"], "uuid": s["uuid"], "user": u["user"], "n": 1} for u in s["users"] if u["squat"])
        for uuid, idx, total in store.db.execute("SELECT uuid, idx, memory_total FROM cards"):
            if idx is not None:
                cards[uuid] = str(idx)
            if total:
                memory_total[uuid] = total
    for card in service.fleet.latest().cards:
        cards[card.uuid] = str(card.index)
        memory_total.setdefault(card.uuid, card.memory_total_mib)
    for b in bookings:
        for index, uuid in zip(b.cards, b.card_uuids):
            cards.setdefault(uuid, str(index))
    pools: dict[str, str] = {}
    for uuid, name in cards.items():
        names = [p.name for p in service.config.pools if name.isdigit() and int(name) in p.cards]
        if names:
            pools[uuid] = "+".join(names)
    return compute(bookings, rollups, squats, faults, now=now, since_s=since_s, by=by,
                   busy_util=service.config.report.busy_util, pools=pools, cards=cards, memory_total=memory_total)

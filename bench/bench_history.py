"""The history's cost (issue 12, sections 1 and 7): a synthetic year on disk, and the service with history on and off.

1. A synthetic year: 8 simulated cards, 365 days of 5-minute rollups and the last 48 h of raw samples
   (every 10 s, with the users' processes), as the service would hold them after a year. The rollups
   come from the simulated fleet at each bucket and a seeded schedule of bookings (booked 2-72 h,
   idle or in use, free 0-24 h, now and then a squatter); the raw samples go through HistoryStore.add
   and the real roll_up; then the finished days are summed for the report (day_sums), as the sampler does. Reports
   the file size (target: 50 MB or less) and each table's share.

       .venv/bin/python bench/bench_history.py year [--days 365] [--cards 8] [--keep PATH] [--json]

2. The service's CPU and RSS with history on and off, side by side in the same run: two agents on the
   simulated 8 cards, one with [history] enabled = false, one with it on, for --seconds. Root only
   (bench/shared_install.py). `--sample-s 1` makes the cost ten times easier to see.

       sudo .venv/bin/python bench/bench_history.py service [--seconds 120] [--sample-s 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.config import ReportSettings  # noqa: E402
from app.core.cardstate import BOOKED, FREE, IN_USE, SQUATTED, UNKNOWN_USER  # noqa: E402
from app.gpu.simulated import SimulatedSource  # noqa: E402
from app.history.store import BUCKET_S, SLOT_BITS, STATES, HistoryStore, Sample, _bucket_id  # noqa: E402

NOW = 1_796_000_000  # a fixed "now" (2026-11-30), so two runs write the same file
RAW_HOURS = 48
SAMPLE_S = 10
USERS = ("alice", "bob", "carol", "dave", "erin")


class Schedule:
    """Per card, who holds it when: alternating free and booked stretches, seeded; now and then a squatter."""

    def __init__(self, cards: int, start: int, end: int, seed: int = 12) -> None:
        rng = random.Random(seed)
        self.stretches: list[list[tuple[int, int, int | None, str | None, bool]]] = []
        booking = 0
        for _ in range(cards):
            stretches, t = [], start
            while t < end:
                free = rng.randint(0, 24 * 3600)
                squatter = rng.random() < 0.05
                stretches.append((t, t + free, None, rng.choice(USERS) if squatter else None, False))
                t += free
                booking += 1
                booked = rng.randint(2 * 3600, 72 * 3600)
                idle = rng.random() < 0.3  # booked and idle
                stretches.append((t, t + booked, booking, rng.choice(USERS), idle))
                t += booked
            self.stretches.append(stretches)
        self._at = [0] * cards

    def at(self, card: int, ts: int) -> tuple[int | None, str | None, bool]:
        """(booking, user, idle) at ts; booking None: free (user: a squatter or None). Ask in time order."""
        stretches, i = self.stretches[card], self._at[card]
        while stretches[i][1] <= ts:
            i += 1
        self._at[card] = i
        return stretches[i][2:]


def _state(booking: int | None, user: str | None, idle: bool) -> str:
    if booking is None:
        return SQUATTED if user else FREE
    return BOOKED if idle else IN_USE


def synthetic_year(path: Path, *, days: int = 365, cards: int = 8, now: int = NOW) -> dict:
    """Write `days` of rollups and 48 h of raw samples for `cards` simulated cards to `path`; return figures."""
    from dataclasses import replace

    from app.gpu.simulated import DEFAULT_FLEET, _cards

    store = HistoryStore(path)
    db = store.db
    clock = [0.0]
    fleet = SimulatedSource(replace(DEFAULT_FLEET, cards=_cards(cards, 2)), clock=lambda: clock[0])
    first = fleet.read()
    ids = [store.card_id(c.uuid, c.index, c.name, c.memory_total_mib) for c in first.cards]
    raw_from = now - RAW_HOURS * 3600
    start = raw_from - (days * 86400 - RAW_HOURS * 3600) // BUCKET_S * BUCKET_S
    schedule = Schedule(cards, start, now + 1)
    per_bucket = BUCKET_S // SAMPLE_S
    started = time.perf_counter()

    def rollups():
        for bucket in range(start, raw_from, BUCKET_S):
            clock[0] = bucket + BUCKET_S / 2
            for card, reading in zip(ids, fleet.read().cards):
                booking, user, idle = schedule.at(reading.index, bucket)
                state = _state(booking, user, idle)
                util = reading.utilization_pct if state in (IN_USE, SQUATTED) else 0
                spread = 20 if util else 0
                row = {"id": _bucket_id(bucket, card), "n": per_bucket, "dt": SAMPLE_S,
                       "state": STATES.index(state), "n_throttled": per_bucket * (reading.temperature_c >= 92),
                       "throttle": reading.throttle_reasons, "pcie_mean": round(reading.pcie_tx_mib_s) if util else 0}
                for metric, value, jitter in (("vram", reading.memory_used_mib, 150), ("util", util, spread),
                                              ("temp", reading.temperature_c, 2), ("power", round(reading.power_w), 40),
                                              ("sm", reading.sm_clock_mhz, 60)):
                    least = max(0, value - jitter)
                    row |= {f"{metric}_min": least, f"{metric}_mean_d": value - least,
                            f"{metric}_max_d": value + jitter - least}
                yield row

    db["rollups"].insert_all(rollups(), batch_size=2000)
    db["meta"].upsert({"key": "rolled_to", "value": raw_from}, pk="key")
    rolled_at = time.perf_counter()

    batch = []
    for ts in range(raw_from, now, SAMPLE_S):
        clock[0] = ts
        for reading in fleet.read().cards:
            booking, user, idle = schedule.at(reading.index, ts)
            state = _state(booking, user, idle)
            users = tuple((p.user or UNKNOWN_USER, p.used_mib) for p in reading.processes) if state != BOOKED else ()
            if state == SQUATTED and not users:
                users = ((user, 8000),)
            batch.append(Sample(ts=ts, uuid=reading.uuid, state=state, dt=SAMPLE_S, vram=reading.memory_used_mib,
                                util=reading.utilization_pct if state in (IN_USE, SQUATTED) else 0,
                                temp=reading.temperature_c, power=round(reading.power_w),
                                power_limit=round(reading.power_limit_w), sm=reading.sm_clock_mhz,
                                throttle=reading.throttle_reasons, booking=booking,
                                pcie=round(reading.pcie_tx_mib_s) if state in (IN_USE, SQUATTED) else 0,
                                holder=user if booking else None, users=users))
        if len(batch) >= 360 * cards:  # an hour a transaction
            store.add(batch)
            batch = []
    store.add(batch)
    store.roll_up(now)
    store.prune(now, raw_hours=RAW_HOURS, rollup_days=days + 1)
    store.summarise(ReportSettings().busy_util, days=None)  # as the sampler has, day by day
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    written = time.perf_counter()
    counts = {t: db[t].count for t in ("samples", "sample_users", "rollups", "squats", "cards")}
    # What the readers do: the card detail's week, and a year's figures per card (what a report sums up).
    timings = {}
    begun = time.perf_counter()
    store.series(first.cards[0].uuid, now - 7 * 86400, now, 1800)
    timings["week_of_one_card_ms"] = round(1000 * (time.perf_counter() - begun), 1)
    begun = time.perf_counter()
    db.execute("SELECT card, state, sum(seconds), avg(util_mean), max(vram_max) FROM rollup_view"
               " WHERE ts >= ? GROUP BY card, state", [now - 365 * 86400]).fetchall()
    timings["year_by_card_and_state_ms"] = round(1000 * (time.perf_counter() - begun), 1)
    try:
        pages = dict(db.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
    except sqlite3.OperationalError:  # an SQLite built without dbstat
        pages = {}
    store.close()
    size = path.stat().st_size
    return {"days": days, "cards": cards, "bytes": size, "mb": round(size / 1e6, 1), "rows": counts,
            "table_mb": {name: round(b / 1e6, 2) for name, b in sorted(pages.items(), key=lambda kv: -kv[1])},
            "bytes_per_rollup": round(pages.get("rollups", 0) / max(1, counts["rollups"]), 1),
            "write_s": {"rollups": round(rolled_at - started, 1), "raw": round(written - rolled_at, 1)},
            "query": timings,
            "slot_bits": SLOT_BITS}


def service_side_by_side(seconds: float, sample_s: float) -> dict:
    """Two agents on the simulated 8 cards at once, history off and on: CPU seconds and RSS of each."""
    sys.path.insert(0, str(REPO / "bench"))
    from shared_install import cpu_seconds, rss_kib, shared_install

    with (shared_install(extra_toml="[history]\nenabled = false\n") as off,
          shared_install(extra_toml=f"[history]\nenabled = true\nsample_s = {sample_s}\n") as on):
        pids = {"off": off.agent_pid, "on": on.agent_pid}
        time.sleep(2)  # both past their start
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        rss_peak = {k: 0 for k in pids}
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for k, p in pids.items():
                rss_peak[k] = max(rss_peak[k], rss_kib(p))
            time.sleep(1)
        cpu = {k: cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
        history_file = on.db.with_name(on.db.stem + ".history.db")
        size = sum(p.stat().st_size for p in (history_file, history_file.with_name(history_file.name + "-wal"))
                   if p.exists())
        conn = sqlite3.connect(f"file:{history_file}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT count(*) FROM samples").fetchone()[0]
        finally:
            conn.close()
    return {"seconds": seconds, "sample_s": sample_s,
            "cpu_pct": {k: round(100 * v / seconds, 2) for k, v in cpu.items()},
            "rss_mib": {k: round(v / 1024, 1) for k, v in rss_peak.items()},
            "history_rows": rows, "history_bytes": size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    year = sub.add_parser("year")
    year.add_argument("--days", type=int, default=365)
    year.add_argument("--cards", type=int, default=8)
    year.add_argument("--keep", type=Path, help="write the file here and keep it")
    year.add_argument("--json", action="store_true")
    service = sub.add_parser("service")
    service.add_argument("--seconds", type=float, default=120)
    service.add_argument("--sample-s", type=float, default=10)
    service.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.what == "year":
        with tempfile.TemporaryDirectory() as scratch:
            path = args.keep or Path(scratch) / "board.history.db"
            figures = synthetic_year(path, days=args.days, cards=args.cards)
        if args.json:
            print(json.dumps(figures))
        else:
            print(f"{figures['cards']} cards, {figures['days']} days: {figures['mb']} MB (target 50 MB)")
            print(f"  rows {figures['rows']}")
            print(f"  by table (MB) {figures['table_mb']}; {figures['bytes_per_rollup']} bytes a rollup")
            print(f"  written in {figures['write_s']} s; queries {figures['query']}")
        return 0 if figures["bytes"] <= 50e6 else 1
    figures = service_side_by_side(args.seconds, args.sample_s)
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"{args.seconds:g} s on the simulated 8 cards, history every {args.sample_s:g} s:")
        print(f"  CPU  off {figures['cpu_pct']['off']} %   on {figures['cpu_pct']['on']} %")
        print(f"  RSS  off {figures['rss_mib']['off']} MiB   on {figures['rss_mib']['on']} MiB (peak)")
        print(f"  history: {figures['history_rows']} samples, {figures['history_bytes']} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The backfill (issue 11, sections 3 and 8): the time to move 100 queued bookings up after one release, median, run side
by side (interleaved, so machine noise hits every case alike) with the same release when nothing is queued, the
baseline for the ratios, and a plain `book` on the same database.

    .venv/bin/python bench/bench_backfill.py [--queued 100] [--hold 48] [--runs 10]

In process, on BookingService (what the service's every write op ends with: `release` is the user's op, `backfill()`
the moves that follow it), a real SQLite file per run and the simulated fleet with its processes cleared (squatters
would keep cards out of a slot that starts now, which is another matter). Default Config: no pools, no windows.

The scenario, set up off the clock with a controllable clock: at T0 one user books all 8 cards for 48 h (--hold);
then, a minute apart, 100 bookings from 12 users ask for --asap (or_later from T0): classes in turn, 1 to 8 cards,
30 min to 2 h (about 37 h of the whole fleet), so they queue behind it, from T0 + 48 h on. At T0 + 1 h the holder
releases; `backfill()` moves the queue up into the 47 h that freed, so every queued booking has an earlier start to
take. The script checks what moved: none later, the holder's booking untouched but for its end, backfill's report
agreeing with the database; and says how many of the queue moved, and how many more a second pass would move. With
a shorter --hold (12) the freed time cannot take the whole queue, and a booking whose earliest start is still its own
stays: the figure says so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from msgspec.structs import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.config import CLASSES, Config  # noqa: E402
from app.core.identity import Identity  # noqa: E402
from app.gpu import open_source  # noqa: E402
from app.service.rules.bookings import BookingService  # noqa: E402
from app.store import bookings as rows  # noqa: E402
from app.store.db import connect  # noqa: E402

T0 = 1795966200  # Sunday 2026-11-29 15:30 UTC, as the tests' FROZEN_NOW
HOUR = 3600
COUNTS = (1, 2, 1, 4, 2, 1, 8, 2, 1, 4)
MINUTES = (30, 45, 60, 90, 120)
USERS = 12


class Clock:
    """Time as the scenario says; BookingService reads it through __call__."""

    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> float:
        return self.now


def quiet_fleet():
    fleet = open_source(True, clock=lambda: T0).read()
    return [replace(card, processes=()) for card in fleet.cards], fleet.topology


def scenario(db: Path, queued: int, hold: int) -> tuple[BookingService, Clock, int, dict]:
    """The holder's booking and `queued` bookings behind it, at T0 + 1 h; returns the holder's rules, the clock, the
    holder's booking id and every booking's start before the release."""
    cards, topology = quiet_fleet()
    clock, config = Clock(T0), Config()
    conn = connect(db)
    rows.keep_calendar(conn, T0 - 86400)  # as the service keeps its connection's (app.service.Service.conn)

    def rules(n: int) -> BookingService:
        return BookingService(conn, Identity(f"user{n}", 2000 + n, False), config, cards, topology, clock)

    holder = rules(USERS)
    held = holder.create(cards=range(8), start=T0, end=T0 + hold * HOUR, klass="batch", note="holds the fleet")
    for n in range(queued):
        clock.now = T0 + 60 * n
        rules(n % USERS).create(count=COUNTS[n % len(COUNTS)], start=clock.now,
                                end=clock.now + MINUTES[n % len(MINUTES)] * 60, klass=CLASSES[n % len(CLASSES)],
                                note=f"queued {n}", or_later=True)
    clock.now = T0 + HOUR
    before = {b.id: b.start for b in rows.live_between(conn, T0, 2**62)}
    return holder, clock, held.id, before


def one_run(tmp: Path, queued: int, hold: int, run: int) -> dict[str, float]:
    """Times (seconds) of one run of each case, and how many moved."""
    times: dict[str, float] = {}

    # Baseline: the same release with nothing queued.
    holder, clock, held, _ = scenario(tmp / f"empty{run}.db", 0, hold)
    start = time.perf_counter()
    holder.release(held)
    times["baseline: release, nothing queued"] = time.perf_counter() - start
    start = time.perf_counter()
    if holder.backfill():
        raise SystemExit("the backfill moved something with nothing queued")
    times["  then backfill() (nothing to move)"] = time.perf_counter() - start
    holder.conn.close()

    holder, clock, held, before = scenario(tmp / f"queue{run}.db", queued, hold)
    conn = holder.conn
    if len(rows.queued(conn, clock.now)) != queued:
        raise SystemExit(f"expected {queued} queued bookings, found {len(rows.queued(conn, clock.now))}")
    start = time.perf_counter()
    holder.release(held)
    times[f"release, {queued} queued"] = time.perf_counter() - start
    start = time.perf_counter()
    moved = holder.backfill()
    times[f"  then backfill() (the moves): {queued} queued"] = time.perf_counter() - start
    times["moved"] = len(moved)

    after = {b.id: b for b in rows.live_between(conn, T0, 2**62)}
    later = [i for i, b in after.items() if b.start > before[i]]
    if later:
        raise SystemExit(f"bookings {later} moved later")
    if after[held].start != T0 or after[held].end != clock.now:
        raise SystemExit("the holder's booking changed beyond its release")
    ids = {after_.id for _, after_ in moved}
    if any(after[i].start >= before[i] for i in ids) or any(after[i].start < before[i] for i in after if i not in ids):
        raise SystemExit("backfill's report disagrees with the database")
    times["wait before (h)"] = statistics.mean(before[i] - T0 for i in after if i != held) / HOUR
    times["wait after (h)"] = statistics.mean(after[i].start - T0 for i in after if i != held) / HOUR
    # One pass is what a release gets; the next write op or enforcer pass runs another: does it find more?
    times["second pass"] = len(holder.backfill())

    # A plain booking on the same database, after the queue, for scale.
    plain = BookingService(conn, Identity("plain", 1999, False), holder.config, list(holder.cards.values()),
                           holder.topology, clock)
    begin = clock.now + 7 * 24 * HOUR
    start = time.perf_counter()
    plain.create(cards=(0, 1), start=begin, end=begin + HOUR, klass="experiment")
    times[f"plain book, 2 cards, {queued} + 1 bookings around"] = time.perf_counter() - start
    conn.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=100)
    parser.add_argument("--hold", type=int, default=48, help="hours the released booking held all 8 cards for")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one_run(Path(tmp), args.queued, args.hold, -1)  # a first run, untimed: imports, the page cache
        runs = [one_run(Path(tmp), args.queued, args.hold, run) for run in range(args.runs)]
    figures = {"moved", "wait before (h)", "wait after (h)", "second pass"}
    cases = [name for name in runs[0] if name not in figures]
    base = statistics.median(r[cases[0]] for r in runs)
    print(f"{args.runs} runs, interleaved; one release at T0 + 1 h of a booking that held all 8 cards until T0 + {args.hold} h;"
          f" {sys.executable}:")
    print(f"  {'case':52} {'median ms':>9} {'min ms':>7} {'max ms':>7} {'ratio':>7}")
    for name in cases:
        values = [r[name] * 1000 for r in runs]
        median = statistics.median(values)
        print(f"  {name:52} {median:9.2f} {min(values):7.2f} {max(values):7.2f} {median / (base * 1000):6.1f}x")
    moved = sorted({int(r["moved"]) for r in runs})
    backfill = statistics.median(r[f"  then backfill() (the moves): {args.queued} queued"] for r in runs)
    count = moved[0]
    print(f"  moved up: {' / '.join(map(str, moved))} of {args.queued} queued bookings"
          + (" (all of them)" if moved == [args.queued] else f" ({args.queued - count} kept their start in that pass)"))
    again = sorted({int(r["second pass"]) for r in runs})
    print(f"  a second backfill() right after (untimed) moves {' / '.join(map(str, again))} more")
    print(f"  per booking moved: {backfill * 1000 / max(count, 1):.2f} ms (backfill median / moved);"
          f" mean start after T0: {runs[0]['wait before (h)']:.1f} h before the release, {runs[0]['wait after (h)']:.1f} h after")
    if moved != [args.queued]:
        print(f"  NOTE: not all {args.queued} moved; the figure above is for {count}")


if __name__ == "__main__":
    main()

"""What projects cost (issue 34), each against a board without projects run side by side (interleaved, so machine
noise hits every case alike), medians:

1. `book` of 1 card for 1 h on a board without projects (the baseline for the ratios), with projects but no
   budget, and with a GPU-hour budget (read across the project's bookings this month); and a refused booking's
   search for the earliest start a budget allows.
2. The queue's one read for fair share (BookingService._queue: what a backfill round and a queued booking's place
   add): --past bookings over the 70-day lookback, 20 queued, with two projects against none.
3. The gateway's wait queue (app.gateway.waiting.WaitQueue): a push and a pop per request with 1,000 and 10,000
   waiting across 10 projects and 500 members (the queue before issue 34 scanned a list per pop: O(n)).

    .venv/bin/python bench/bench_projects.py [--bookings 300] [--past 2000] [--runs 15]

In process, on BookingService with the calendar in memory as the service keeps it, a real SQLite file per case and
the simulated fleet with its processes cleared. The month holds --bookings of the project's bookings (1 card,
1 h, on cards 0-6, spread over the month before and after now), made off the clock; each timed `book` is cancelled again off the
clock, so every run sees the same calendar.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from msgspec.structs import replace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from app.config import Config, Project  # noqa: E402
from app.gateway.waiting import Usage, WaitQueue  # noqa: E402
from app.core.identity import Identity  # noqa: E402
from app.errors import NotPermitted  # noqa: E402
from app.gpu import open_source  # noqa: E402
from app.service.rules.bookings import BookingService  # noqa: E402
from app.store import bookings as rows  # noqa: E402
from app.store.db import connect  # noqa: E402

T0 = 1795966200  # Sunday 2026-11-29 15:30 UTC, as the tests' FROZEN_NOW
HOUR = 3600
ME = Identity("alice", 2001, False)


class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> float:
        return self.now


def configs(bookings: int) -> dict[str, Config]:
    team = ("alice", "bob")
    return {
        "no projects": Config(),
        "projects, no budget": Config(projects=(Project(name="B", members=team),)),
        # The month's bookings leave 2 h of the budget: the timed 1-h booking fits, the 4-card 1-h one does not.
        "budget": Config(projects=(Project(name="B", members=team, gpu_hours=bookings + 2),)),
    }


def board(path: Path, config: Config, bookings: int) -> tuple[BookingService, Clock]:
    fleet = open_source(True, clock=lambda: T0).read()
    cards = [replace(card, processes=()) for card in fleet.cards]
    clock = Clock(T0 - 28 * 86400 + 3600)  # 1 Nov 01:00: the month's bookings, made from its start
    conn = connect(path)
    rows.keep_calendar(conn, T0 - 40 * 86400)
    rules = BookingService(conn, ME, config, cards, fleet.topology, clock)
    first = int(clock.now)
    spread = (T0 + 86400 - first) // bookings  # to a day past now, within the month
    for n in range(bookings):
        start = first + n * spread
        clock.now = start
        rules.create(cards=[n % 7], start=start, end=start + HOUR, klass="experiment")  # card 7 kept free
    clock.now = T0
    return rules, clock


def timed_book(rules: BookingService, start: int) -> float:
    began = time.perf_counter()
    booking = rules.create(cards=[7], start=start, end=start + HOUR, klass="experiment")
    took = time.perf_counter() - began
    rules.cancel(booking.id)
    return took


def timed_refusal(rules: BookingService, start: int) -> float:
    """A booking past the budget, worded with the earliest start that works (the budget's reset)."""
    began = time.perf_counter()
    try:
        rules.create(count=4, start=start, end=start + HOUR, klass="experiment")
    except NotPermitted as refused:
        assert "resets" in str(refused), refused
    else:
        raise SystemExit("the booking past the budget was not refused")
    return time.perf_counter() - began


def queue_board(path: Path, past: int) -> BookingService:
    """`past` bookings of projects A and B over the lookback, 20 queued for tomorrow."""
    fleet = open_source(True, clock=lambda: T0).read()
    conn = connect(path)
    uuids = [c.uuid for c in fleet.cards]
    rows.sync_cards(conn, fleet.cards, T0)
    span = 70 * 86400 // (past // 8 + 1)
    with conn:
        for i in range(past):
            start = T0 - 70 * 86400 + (i // 8) * span
            rows.insert(conn, user="u", uid=1, uuids=[uuids[i % 8]], start=start, end=start + span, klass="batch",
                        note="", request=None, now=start, created_by=1, project="AB"[i % 2])
        for i in range(20):
            start = T0 + 86400 + i * HOUR
            rows.insert(conn, user="u", uid=1, uuids=[uuids[i % 8]], start=start, end=start + HOUR, klass="batch",
                        note="", request=None, now=T0, created_by=1, requested_at=T0 + HOUR, queued="time",
                        project="AB"[i % 2])
    return BookingService(conn, ME, Config(), fleet.cards, fleet.topology, lambda: T0)


def queue_reads(past: int, runs: int, tmp: str) -> dict[str, list[float]]:
    rules = queue_board(Path(tmp) / "queue.db", past)
    two = Config(projects=(Project(name="A", members=("u",)), Project(name="B", members=("u",), share=2)))
    times: dict[str, list[float]] = {"no projects": [], "two projects": []}
    for _ in range(runs):
        for name, config in (("no projects", Config()), ("two projects", two)):
            rules.config = config
            began = time.perf_counter()
            rules._queue(T0)
            times[name].append(time.perf_counter() - began)
    return times


def gateway_queue(waiting: int) -> tuple[float, float]:
    """Microseconds per request: (push, pop + its member's turn), `waiting` at once."""
    import asyncio
    import random

    async def run() -> tuple[float, float]:
        queue = WaitQueue(Usage(7 * 86400, {f"p{i}": 1.0 + i % 3 for i in range(10)}))
        ready = asyncio.get_running_loop().create_future()
        rng = random.Random(1)
        members = [(f"u{i}", f"p{i % 10}") for i in range(500)]
        began = time.perf_counter()
        for _ in range(waiting):
            user, project = members[rng.randrange(500)]
            queue.push(rng.randrange(4), project, user, "m", ready)
        pushed = time.perf_counter()
        served = 0
        while (waiter := queue.pop("m")) is not None:
            queue.served(waiter.user, "m")
            served += 1
            if served % 50 == 0:  # answers finish as others wait: their projects move
                queue.charged(f"p{served % 10}", 100, T0 + served)
        popped = time.perf_counter()
        return (pushed - began) / waiting * 1e6, (popped - pushed) / waiting * 1e6

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bookings", type=int, default=300)
    parser.add_argument("--past", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        boards = {name: board(Path(tmp) / f"{n}.db", config, args.bookings)
                  for n, (name, config) in enumerate(configs(args.bookings).items())}
        times: dict[str, list[float]] = {name: [] for name in boards}
        times["budget: refused, worded"] = []
        for run in range(args.runs):
            start = T0 + HOUR + run * 600  # on card 7, free all month; the same month as the others
            for name, (rules, _) in boards.items():
                times[name].append(timed_book(rules, start))
            times["budget: refused, worded"].append(timed_refusal(boards["budget"][0], start))
        reads = queue_reads(args.past, args.runs, tmp)
    for title, found in ((f"book 1 card for 1 h, {args.bookings} bookings this month", times),
                         (f"the queue's read for fair share, {args.past} past bookings, 20 queued", reads)):
        base = statistics.median(found["no projects"])
        print(f"{title}, median of {args.runs}:")
        for name, each in found.items():
            median = statistics.median(each)
            print(f"  {name:26} {median * 1000:7.2f} ms   {median / base:5.2f}x")
    print("the gateway's wait queue, per request:")
    for waiting in (1_000, 10_000):
        push, pop = gateway_queue(waiting)
        print(f"  {waiting:6} waiting: push {push:5.1f} us, pop {pop:5.1f} us")


if __name__ == "__main__":
    main()

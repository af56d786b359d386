"""`board ical` over 10,000 bookings (issue 11, section 8): the file's size, the writer's time in process, and the
command end to end against `board list --json` over the same bookings, run side by side (interleaved, so machine
noise hits every case alike). Medians; the ratio is against `board list --json`.

    .venv/bin/python bench/bench_ical.py [--bookings 10000] [--runs 10]

File mode (BOARD_DB, the simulated fleet), no root. The bookings are written straight into a fresh database, off
the clock: 8 cards, a dozen users, the four classes, notes with commas, accents and a few long ones, every tenth
booking an occurrence of a series; all within the next 90 days, so `board ical` and `board list --json` (both with
their default windows) select the same ones. In process, the icalendar package building the same calendar is timed
too, for the choice of our own writer. Every export is checked to be byte-identical to the first.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BIN = Path(sys.executable).parent
CLASSES = ("online", "batch", "finetune", "experiment")
NOTES = ("", "prod TP4", "eval, run 3; seed 17", "finetune llama-3 8B — épocas 2", "sweep " * 40, "ablation\nsecond line")


def seed(db: Path, count: int) -> None:
    """`count` bookings on 8 cards within the next 90 days, no two overlapping on a card; every tenth in a series."""
    from app.gpu import open_source
    from app.store import bookings as rows
    from app.store.db import connect

    conn = connect(db)
    with conn:
        rows.sync_cards(conn, open_source(True).read().cards, int(time.time()))
    uuids = [uuid for uuid, in conn.execute("SELECT uuid FROM cards ORDER BY idx")]
    start0 = int(time.time()) + 3600
    per_card = -(-count // 4)  # two-card bookings on four pairs of cards
    step = (89 * 86400) // per_card
    made = start0 - 86400
    with conn:
        series = conn.execute("INSERT INTO series (user, uid, rule, created_at) VALUES ('user0', 2000, '{}', ?)",
                              (made,)).lastrowid
        for n in range(count):
            pair, slot = n % 4, n // 4
            start = start0 + slot * step
            rows.insert(conn, user=f"user{n % 12}", uid=2000 + n % 12, uuids=uuids[2 * pair:2 * pair + 2], start=start,
                        end=start + step - 60, klass=CLASSES[n % 4], note=NOTES[n % len(NOTES)], request=None,
                        now=made + n, created_by=0, series_id=series if n % 10 == 0 else None)
    conn.close()


def timed(argv: list[str], env: dict) -> tuple[float, float, bytes]:
    """(wall seconds, CPU seconds of the child: user + system, its stdout)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=err, cwd=REPO)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv)} failed: {err.read().decode().strip()}")
        out.seek(0)
        return elapsed, usage.ru_utime + usage.ru_stime, out.read()


def median_of(runs: int, work) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def in_process(env: dict, runs: int) -> None:
    """The writer alone, on the bookings as the CLI holds them; the list call and a JSON dump for scale."""
    import json

    from app.client.local import LocalClient
    from app.config import load_config
    from app.core.ical import calendar
    from app.model import booking_from_wire
    from app.output import booking_json

    os.environ.update(env)
    client = LocalClient.open(load_config(None, os.environ), demo=None, environ=os.environ)
    now = int(time.time())
    found = client.call("list", start=now - 7 * 86400, end=now + 90 * 86400)["bookings"]
    bookings = [booking_from_wire(b) for b in found]
    data = calendar(bookings, domain="bench.example")
    cases = {
        "client.call('list') (the query, both commands)": lambda: client.call("list", start=now - 7 * 86400,
                                                                             end=now + 90 * 86400)["bookings"],
        "json.dumps of board list --json's document": lambda: json.dumps({"bookings": [booking_json(b) for b in found]},
                                                                         indent=2),
        "booking_from_wire + app.core.ical.calendar": lambda: calendar([booking_from_wire(b) for b in found],
                                                                       domain="bench.example"),
    }
    try:
        import icalendar

        def with_icalendar() -> bytes:  # the same properties through the package (which the tests read it with)
            from datetime import datetime, timezone

            from app.core.ical import description, summary

            cal = icalendar.Calendar()
            cal.add("prodid", "-//board//board ical//EN")
            cal.add("version", "2.0")
            for b in bookings:
                event = icalendar.Event()
                event.add("uid", f"board-booking-{b.id}@bench.example")
                event.add("dtstamp", datetime.fromtimestamp(b.created_at, timezone.utc))
                event.add("dtstart", datetime.fromtimestamp(b.start, timezone.utc))
                event.add("dtend", datetime.fromtimestamp(b.end, timezone.utc))
                event.add("summary", summary(b))
                event.add("description", description(b))
                event.add("categories", [b.klass] + ([f"series {b.series_id}"] if b.series_id else []))
                cal.add_component(event)
            return cal.to_ical()

        cases["the icalendar package, same events (for comparison)"] = with_icalendar
    except ImportError:
        pass
    print(f"in process, {len(found)} bookings, median of {runs}:")
    for name, work in cases.items():
        print(f"  {name:56} {median_of(runs, work) * 1000:8.1f} ms")
    print(f"  calendar size: {len(data):,} bytes ({len(data) / max(len(found), 1):.0f} bytes per event),"
          f" {data.count(b'BEGIN:VEVENT'):,} events")


def end_to_end(env: dict, runs: int) -> None:
    board = str(BIN / "board")
    cases = {"baseline: board list --json": [board, "list", "--json"], "board ical": [board, "ical"]}
    wall: dict[str, list[float]] = {name: [] for name in cases}
    cpu: dict[str, list[float]] = {name: [] for name in cases}
    sizes: dict[str, int] = {}
    digests: set[str] = set()
    for _ in range(runs):
        for name, argv in cases.items():  # interleaved
            elapsed, used, out = timed(argv, env)
            wall[name].append(elapsed)
            cpu[name].append(used)
            sizes[name] = len(out)
            if name == "board ical":
                digests.add(hashlib.sha256(out).hexdigest())
    base, base_cpu = statistics.median(wall[next(iter(cases))]), statistics.median(cpu[next(iter(cases))])
    print(f"end to end, {runs} runs each, interleaved, file mode (BOARD_DB, the simulated fleet):")
    print(f"  {'case':30} {'median s':>8} {'min s':>7} {'max s':>7} {'ratio':>6}   {'CPU s':>6} {'ratio':>6}  {'output':>11}")
    for name, values in wall.items():
        median, cpu_median = statistics.median(values), statistics.median(cpu[name])
        print(f"  {name:30} {median:8.3f} {min(values):7.3f} {max(values):7.3f} {median / base:5.2f}x"
              f"   {cpu_median:6.3f} {cpu_median / base_cpu:5.2f}x  {sizes[name]:>11,} B")
    print(f"  every board ical output byte-identical: {'yes' if len(digests) == 1 else f'NO ({len(digests)} distinct)'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bookings", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "app")], check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as tmp:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("BOARD_")},
               "BOARD_DB": f"{tmp}/board.db", "BOARD_SIMULATE": "1", "XDG_STATE_HOME": f"{tmp}/state"}
        seed(Path(env["BOARD_DB"]), args.bookings)
        in_process(env, args.runs)
        end_to_end(env, args.runs)


if __name__ == "__main__":
    main()

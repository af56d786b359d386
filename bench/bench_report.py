"""`board report --since 365d` on a synthetic year, beside `board list --json` (the baseline: the same CLI start,
one small query), interleaved, each run a fresh process.

The year is bench_history.synthetic_year's (8 simulated cards, 365 days of rollups, 48 h of raw samples) in
board.history.db, and board.db holds its schedule's bookings (each asked for 0-90 minutes before its start).

    .venv/bin/python bench/bench_report.py [--days 365] [--runs 5] [--json] [--against OTHER_CHECKOUT]

--against runs the other checkout's `board report` (its own .venv) on the same files in the same rounds, for a
before-and-after in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_history import RAW_HOURS, Schedule, synthetic_year  # noqa: E402

from app.history.store import BUCKET_S  # noqa: E402


def make_year(root: Path, days: int, now: int) -> dict:
    from app.gpu.simulated import SimulatedSource
    from app.store import bookings as rows
    from app.store.db import connect

    figures = synthetic_year(root / "board.history.db", days=days, now=now)
    # The same schedule synthetic_year drew (same seed and span), as bookings.
    raw_from = now - RAW_HOURS * 3600
    start = raw_from - (days * 86400 - RAW_HOURS * 3600) // BUCKET_S * BUCKET_S
    schedule = Schedule(8, start, now + 1)
    cards = SimulatedSource(clock=lambda: now).read().cards
    conn = connect(root / "board.db")
    rows.sync_cards(conn, cards, start - 86400)
    rng, count = random.Random(7), 0
    for card, stretches in enumerate(schedule.stretches):
        for begin, end, booking, user, _idle in stretches:
            if booking is None:
                continue
            rows.insert(conn, user=user, uid=2000 + hash(user) % 100, uuids=[cards[card].uuid], start=begin, end=end,
                        klass="batch", note="", request=None, now=begin - 7200, created_by=2000,
                        requested_at=begin - rng.randint(0, 5400))
            count += 1
    conn.commit()
    conn.close()
    return {"history_mb": figures["mb"], "rollups": figures["rows"]["rollups"], "bookings": count}


def timed(args: list[str], env: dict, repo: Path = REPO) -> tuple[float, str]:
    python = sys.executable if repo == REPO else str(repo / ".venv" / "bin" / "python")
    begun = time.perf_counter()
    done = subprocess.run([python, "-m", "app", *args], env=env, cwd=repo, capture_output=True, text=True)
    took = time.perf_counter() - begun
    if done.returncode:
        raise SystemExit(f"board {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[:300]}")
    return took, done.stdout


def same(out: str) -> list:
    """What two runs a few seconds apart must agree on: the rollups' figures (booked hours run to now)."""
    return [[row[k] for k in ("key", "used_h", "idle_h", "squatted_h", "util_mean_pct")]
            for row in json.loads(out)["rows"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--against", type=Path, help="another checkout whose report runs beside this one's")
    args = parser.parse_args()
    now = int(time.time()) // BUCKET_S * BUCKET_S
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        root = Path(tmp)
        made = make_year(root, args.days, now)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BOARD_")}
        env |= {"BOARD_DB": str(root / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC"}
        report, listing, other = [], [], []
        for _ in range(args.runs):  # interleaved, so a busy machine slows both alike
            took, out = timed(["report", "--since", f"{args.days}d", "--json"], env)
            report.append(took)
            listing.append(timed(["list", "--json"], env)[0])
            if args.against:
                took, theirs = timed(["report", "--since", f"{args.days}d", "--json"], env, args.against)
                other.append(took)
                if same(theirs) != same(out):
                    raise SystemExit(f"the reports differ: {args.against}'s and this checkout's")
        doc = json.loads(out)
        table_s = timed(["report", "--since", f"{args.days}d"], env)[0]
    figures = {**made, "runs": args.runs,
               "report_365d_json_s": {"median": round(statistics.median(report), 2), "max": round(max(report), 2)},
               "report_table_s": round(table_s, 2),
               "list_json_s": {"median": round(statistics.median(listing), 2), "max": round(max(listing), 2)},
               "report_over_list": round(statistics.median(report) / statistics.median(listing), 2),
               **({"against_report_s": {"median": round(statistics.median(other), 2), "max": round(max(other), 2)},
                   "against_over_list": round(statistics.median(other) / statistics.median(listing), 2)}
                  if other else {}),
               "rows": len(doc["rows"]), "total_booked_h": doc["total"]["booked_h"],
               "firing": [v["threshold"] for v in doc["verdicts"] if v["fires"]]}
    print(json.dumps(figures, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

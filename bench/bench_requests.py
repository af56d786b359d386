"""A request's check: msgspec.convert into the typed request (app.service.ops.registry) against the older hand
checker it replaced (Op.check's `_check_by_hand`, the same arguments and types), on a typical `book`, per request;
and what importing msgspec costs (a fresh interpreter each time: the best and the median; on a busy machine the
best is the figure).

    .venv/bin/python bench/bench_requests.py [--runs 200000] [--imports 20]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import timeit

from app.service.ops.bookings import book
from app.service.ops.registry import BOOL, DICT, INT, LIST, STR, TIME, Op, lookup

# what `board book 2 --for 4h --note ...` sends, and what the TUI's form adds
BOOK = {"start": 1767261600, "end": 1767276000, "count": 2, "class": "experiment", "note": "fine-tune run 3",
        "checked": True, "or_later": False}
OLDER = Op("book", book, None, {"start": TIME, "end": TIME},
           {"cards": LIST, "count": INT, "class": STR, "host": STR, "note": STR, "request": DICT, "checked": BOOL,
            "or_later": BOOL, "force": BOOL})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--imports", type=int, default=20)
    args = parser.parse_args()
    typed = lookup("book")
    assert typed is not None and typed.request is not None
    assert typed.check(BOOK).count == 2 and OLDER.check(BOOK)["count"] == 2
    for name, entry in (("msgspec.convert", typed), ("older hand check", OLDER)):
        best = min(timeit.repeat(lambda entry=entry: entry.check(BOOK), number=args.runs, repeat=5))
        print(f"{name:>18}: {best / args.runs * 1e6:.2f} µs per request")
    code = "import time; t = time.perf_counter(); import msgspec; print(time.perf_counter() - t)"
    took = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
            for _ in range(args.imports)]
    print(f"    import msgspec: {min(took) * 1000:.1f} ms best, {statistics.median(took) * 1000:.1f} ms median"
          f" ({args.imports} fresh interpreters; with what it brings: typing, re, inspect, decimal, uuid)")


if __name__ == "__main__":
    main()

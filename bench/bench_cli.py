"""Quick-CLI latency: `board book` and `board status --json` on the simulated fleet, against
`python3 -c "import sqlite3"` run side by side (interleaved) on the same machine. Target: 3x or less.

    .venv/bin/python bench/bench_cli.py [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
STDLIB_FLOOR = "import argparse, dataclasses, datetime, grp, hashlib, json, pathlib, pwd, sqlite3, typing, unicodedata"


def timed(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    result = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "BOARD_DB": f"{tmp}/board.db", "BOARD_SIMULATE": "1"}
        board = str(BIN / "board")
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(__file__).parent.parent / "app")],
                       check=True, stdout=subprocess.DEVNULL)  # as an installed package has: bytecode
        subprocess.run([board, "status"], env=env, check=True, stdout=subprocess.DEVNULL)  # create + migrate once
        cases = {
            "baseline: python3 -c 'import sqlite3'": lambda n: [sys.executable, "-c", "import sqlite3"],
            # What the quick path's standard-library imports cost alone: the floor without rewriting them away.
            "stdlib floor: the same imports, no board": lambda n: [sys.executable, "-c", STDLIB_FLOOR],
            "board book 1 --for 10m": lambda n: [board, "book", "1", "--start", f"+{n + 1}h", "--for", "10m"],
            "board status --json": lambda n: [board, "status", "--json"],
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for n in range(runs):
            for name, argv in cases.items():  # interleaved, so machine noise hits every case alike
                samples[name].append(timed(argv(n), env))
    base = statistics.median(samples[next(iter(cases))])
    print(f"{'case':40} {'median ms':>10} {'p90 ms':>8} {'ratio':>6}")
    for name, values in samples.items():
        median = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(f"{name:40} {median * 1000:10.1f} {p90 * 1000:8.1f} {median / base:6.2f}x")


if __name__ == "__main__":
    main()

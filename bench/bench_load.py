"""Load: 32 processes, split between 2 real users, each make 50 booking attempts over 8 cards.

Each process books through BookingService (the code the CLI and the TUI use: BEGIN IMMEDIATE,
the overlap check, the insert and the audit event in one transaction) on one shared database
made by `board init`. In the same run, just before and just after, the same number of processes
(as the same users) do a raw loop of `BEGIN IMMEDIATE; INSERT; COMMIT` on a second file in the
same directory: the floor that SQLite itself sets on this machine (the faster of the two runs). Required: zero overlaps and zero unhandled errors. Target: the
board's attempts per second at least 0.5x the raw loop's.

    sudo .venv/bin/python bench/bench_load.py [--procs 32] [--attempts 50] [--users alice,bob] [--group boardusers]

As root it runs the processes as the given users (setpriv), who must exist, share --group, and
be able to run this Python on this checkout. Not as root, every process is yours (it says so).
Prints a table; --json prints the figures as JSON instead.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

HOUR = 3600


# -- the worker: one process, one user --------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    from app.config import Config
    from app.core.bookings import BookingService
    from app.errors import BadInput, Conflict, NotPermitted
    from app.core.identity import current_identity
    from app.gpu import open_source
    from app.store.db import BUSY_TIMEOUT_MS, connect

    rng = random.Random(args.seed)
    raw = args.mode == "raw"
    if raw:
        conn = sqlite3.connect(args.db, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous = NORMAL")
    else:
        conn = connect(Path(args.db))
        fleet = open_source(True).read()
        service = BookingService(conn, current_identity("board-admin"), Config(), fleet.cards, fleet.topology)
    base = (int(time.time()) // HOUR + 1) * HOUR
    print("ready", flush=True)
    sys.stdin.readline()  # the go signal: every process starts together
    outcomes = {"booked": 0, "conflict": 0, "refused": 0, "error": 0}
    latencies, errors = [], []
    for _ in range(args.attempts):
        start = base + HOUR * rng.randrange(0, args.hours)
        end = start + HOUR * rng.choice((1, 2, 3))
        began = time.perf_counter()
        try:
            if raw:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO raw (user, uid, starts_at, ends_at, note) VALUES (?, ?, ?, ?, ?)",
                             (pwd.getpwuid(os.getuid()).pw_name, os.getuid(), start, end, "bench"))
                conn.execute("COMMIT")
                outcomes["booked"] += 1
            else:
                if rng.random() < args.count_share:
                    service.create(count=rng.choice((1, 2, 4)), start=start, end=end, note="bench")
                else:
                    first = rng.randrange(0, 8)
                    service.create(cards=sorted({first, (first + rng.randrange(0, 2)) % 8}), start=start, end=end,
                                   note="bench")
                outcomes["booked"] += 1
        except Conflict:
            outcomes["conflict"] += 1
        except (NotPermitted, BadInput):
            outcomes["refused"] += 1
        except Exception as error:  # noqa: BLE001 - counted: the requirement is that there are none
            outcomes["error"] += 1
            errors.append(f"{type(error).__name__}: {error}")
        latencies.append(time.perf_counter() - began)
    print(json.dumps({"user": pwd.getpwuid(os.getuid()).pw_name, "outcomes": outcomes, "latencies": latencies,
                      "errors": errors[:5]}), flush=True)


# -- the driver -------------------------------------------------------------------------------------------


def command_as(user: str | None, argv: list[str]) -> list[str]:
    if user is None:
        return argv
    entry = pwd.getpwnam(user)
    return [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}",
            "--init-groups", "--", *argv]


def phase(mode: str, db: Path, users: list[str | None], procs: int, attempts: int, hours: int,
          count_share: float) -> dict:
    """Start `procs` workers (round-robin over users), release them together, collect their reports."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(db.parent),
           "BOARD_SIMULATE": "1"}
    children = []
    for n in range(procs):
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--db", str(db),
                "--attempts", str(attempts), "--hours", str(hours), "--seed", str(n), "--count-share", str(count_share)]
        children.append(subprocess.Popen(command_as(users[n % len(users)], argv), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO))
    for child in children:
        line = child.stdout.readline().strip()
        if line != "ready":
            child.wait()
            raise SystemExit(f"a {mode} worker failed to start: {child.stderr.read().strip()[-500:]}")
    began = time.perf_counter()
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    reports = []
    for child in children:
        out, err = child.communicate(timeout=600)
        if child.returncode != 0:
            raise SystemExit(f"a {mode} worker exited {child.returncode}: {err.strip()[-500:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.perf_counter() - began
    latencies = sorted(x for r in reports for x in r["latencies"])
    outcomes = {k: sum(r["outcomes"][k] for r in reports) for k in reports[0]["outcomes"]}
    total = len(latencies)
    return {
        "mode": mode,
        "processes": procs,
        "users": sorted({r["user"] for r in reports}),
        "attempts": total,
        "wall_s": round(wall, 3),
        "attempts_per_s": round(total / wall, 1),
        "bookings_per_s": round(outcomes["booked"] / wall, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[min(total - 1, int(total * 0.99))] * 1000, 2),
        "max_ms": round(latencies[-1] * 1000, 2),
        "outcomes": outcomes,
        "errors": [e for r in reports for e in r["errors"]][:5],
    }


def verify(db: Path) -> dict:
    from app.store import events

    conn = sqlite3.connect(db)
    try:
        overlaps = conn.execute(
            "SELECT count(*) FROM booking_cards AS x JOIN booking_cards AS y"
            " ON y.card_uuid = x.card_uuid AND y.booking_id > x.booking_id"
            " JOIN bookings AS a ON a.id = x.booking_id JOIN bookings AS b ON b.id = y.booking_id"
            " WHERE a.status = 'booked' AND b.status = 'booked' AND a.starts_at < b.ends_at AND b.starts_at < a.ends_at"
        ).fetchone()[0]
        return {
            "overlaps": overlaps,
            "integrity": conn.execute("PRAGMA integrity_check").fetchone()[0],
            "audit_chain_intact": events.first_broken(conn) is None,
            "bookings": conn.execute("SELECT count(*) FROM bookings").fetchone()[0],
            "events": conn.execute("SELECT count(*) FROM events").fetchone()[0],
            "uids": sorted(r[0] for r in conn.execute("SELECT DISTINCT uid FROM bookings")),
        }
    finally:
        conn.close()


def run(args: argparse.Namespace) -> dict:
    from app.store.db import connect
    from app.store.setup import init_shared

    root_run = os.geteuid() == 0
    users: list[str | None] = [u for u in args.users.split(",") if u] if root_run else [None]
    if root_run:
        for user in users:
            try:
                pwd.getpwnam(user)
            except KeyError:
                raise SystemExit(f"no user {user!r}: create the users (useradd) or pick others with --users") from None
            probe = subprocess.run(command_as(user, [sys.executable, "-c", "import tomllib, app.cli"]), cwd=REPO,
                                   capture_output=True, text=True)
            if probe.returncode != 0:
                raise SystemExit(f"{user} cannot run {sys.executable} on {REPO}; let them reach it (chmod o+x on the"
                                 f" directories above it): {probe.stderr.strip()[-200:]}")
    scratch = Path(tempfile.mkdtemp(prefix="board-bench-", dir=args.dir))
    try:
        os.chmod(scratch, 0o755)
        board_dir = scratch / "board"
        db, raw = board_dir / "board.db", board_dir / "raw.db"
        if root_run:
            init_shared(db, args.group)
        else:
            board_dir.mkdir()
            connect(db).close()
        conn = connect(raw)  # the same pragmas as the board's own file
        conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, user TEXT, uid INTEGER, starts_at INTEGER,"
                     " ends_at INTEGER, note TEXT)")
        conn.close()
        if root_run:
            shutil.chown(raw, group=args.group)
            os.chmod(raw, 0o660)
        # The raw loop before and after the board's run; the faster of the two is the floor (the stricter test:
        # a short raw run is at the mercy of whatever else the machine is doing).
        floors = [phase("raw", raw, users, args.procs, args.attempts, args.hours, args.count_share)]
        board = phase("board", db, users, args.procs, args.attempts, args.hours, args.count_share)
        floors.append(phase("raw", raw, users, args.procs, args.attempts, args.hours, args.count_share))
        floor = max(floors, key=lambda f: f["attempts_per_s"])
        floor["runs_attempts_per_s"] = [f["attempts_per_s"] for f in floors]
        checks = verify(db)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ratio = board["attempts_per_s"] / floor["attempts_per_s"]
    return {
        "as_real_users": root_run,
        "hours": args.hours,
        "count_share": args.count_share,
        "board": board,
        "raw": floor,
        "ratio": round(ratio, 3),
        "checks": checks,
        "ok": checks["overlaps"] == 0 and board["outcomes"]["error"] == 0 and checks["integrity"] == "ok"
        and checks["audit_chain_intact"],
        "target_met": ratio >= 0.5,
    }


def print_table(result: dict) -> None:
    board, raw, checks = result["board"], result["raw"], result["checks"]
    who = ", ".join(board["users"]) if result["as_real_users"] else f"{board['users'][0]} (not root: one user)"
    print(f"{board['processes']} processes as {who}; {board['attempts'] // board['processes']} attempts each; 8 cards;"
          f" starts within {result['hours']} h; {result['count_share']:.0%} of attempts ask for a count")
    print(f"{'':28} {'attempts/s':>10} {'bookings/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, row in (("board (BookingService)", board), ("raw BEGIN IMMEDIATE insert", raw)):
        print(f"{name:28} {row['attempts_per_s']:>10} {row['bookings_per_s']:>10} {row['p50_ms']:>8}"
              f" {row['p99_ms']:>8} {row['max_ms']:>8}")
    o = board["outcomes"]
    print(f"board outcomes: {o['booked']} booked, {o['conflict']} conflicts, {o['refused']} refused by policy,"
          f" {o['error']} unhandled errors" + (f" (first: {board['errors'][0]})" if board["errors"] else ""))
    print(f"checks: {checks['overlaps']} overlaps, integrity {checks['integrity']}, audit chain"
          f" {'intact' if checks['audit_chain_intact'] else 'BROKEN'} ({checks['events']} events),"
          f" bookings by uids {checks['uids']}")
    print(f"raw runs before and after the board's: {' and '.join(map(str, raw['runs_attempts_per_s']))} attempts/s;"
          " the faster is the floor")
    print(f"board/raw attempts per second: {result['ratio']:.2f}x (target >= 0.5x: {'met' if result['target_met'] else 'NOT met'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=32)
    parser.add_argument("--attempts", type=int, default=50)
    parser.add_argument("--hours", type=int, default=168,
                        help="starts are drawn from the next HOURS hours, on the hour (default 168: a week)")
    parser.add_argument("--count-share", type=float, default=0.5,
                        help="share of attempts that ask for a count (board book 2) rather than exact cards (default 0.5)")
    parser.add_argument("--users", default="alice,bob")
    parser.add_argument("--group", default="boardusers", help="a group both users are in (default boardusers)")
    parser.add_argument("--dir", default="/tmp", help="where the scratch databases go (a local disk)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", choices=("board", "raw"), dest="mode", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mode:
        worker(args)
        return 0
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Load through the shared service: 32 client processes as 2 real users (alice and bob, 16 each)
book at once through `board agent`'s socket, each making 50 attempts over the 8 simulated cards
(half of them a count, half exact cards; starts within the next week, on the hour, 1-3 h long).

In the same run, just before and just after, the same number of processes (as the same users)
do a raw loop of `BEGIN IMMEDIATE; INSERT; COMMIT` on a file of their own in a directory beside
the service's (same disk, the board's pragmas): the floor SQLite itself sets on this machine (the
faster of the two runs). Required: zero overlaps (the service's database read afterwards, as root,
read-only), integrity ok, an intact audit chain, zero unhandled errors. Target (issue 8, section 6):
the service's attempts per second at least 0.5x the raw loop's; p50, p99 and max latency printed.

    sudo .venv/bin/python bench/bench_load.py [--procs 32] [--attempts 50] [--users alice,bob] [--group boardusers] [--json]
    sudo .venv/bin/python bench/bench_load.py --against /tmp/old   # and another checkout's agent, in the same run

The agent's CPU over its phase is printed per attempt: on a busy machine that is steadier than attempts per second.
With --against, a second install runs the other checkout's agent (its own .venv/bin/board) and its phase follows
this one's (--theirs-first: precedes it), between the same two raw runs.

Root only: the agent runs as the user board, exactly as the unit runs it, on a throwaway install
(bench/shared_install.py), and the clients as alice and bob through setpriv. Members can no longer
write the board's file, so the old file-mode version of this benchmark is gone. The agent and the
scratch directory are removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import json
import os
import pwd
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_install import (  # noqa: E402
    MEMBERS_GROUP, REPO, as_user, cpu_seconds, release_together, require_root, shared_install,
)

HOUR = 3600


# -- the worker: one process, one user --------------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    from app.errors import BadInput, Conflict, NotPermitted

    rng = random.Random(args.seed)
    raw = args.mode == "raw"
    if raw:
        os.umask(0o002)  # the other user's processes write the same -wal and -shm
        from app.store.db import BUSY_TIMEOUT_MS

        conn = sqlite3.connect(args.target, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA synchronous = NORMAL")
        me = pwd.getpwuid(os.getuid()).pw_name
    else:
        from app.client.socket import SocketClient

        client = SocketClient(args.target)
        me = client.call("whoami")["user"]  # connected before the start signal, as an open board is
    base = (int(time.time()) // HOUR + 1) * HOUR
    print("ready", flush=True)
    sys.stdin.readline()  # the go signal: every process starts together
    outcomes = {"booked": 0, "conflict": 0, "refused": 0, "error": 0}
    latencies, errors = [], []
    cpu0 = time.process_time()
    for _ in range(args.attempts):
        start = base + HOUR * rng.randrange(0, args.hours)
        end = start + HOUR * rng.choice((1, 2, 3))
        began = time.perf_counter()
        try:
            if raw:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO raw (user, uid, starts_at, ends_at, note) VALUES (?, ?, ?, ?, ?)",
                             (me, os.getuid(), start, end, "bench"))
                conn.execute("COMMIT")
            elif rng.random() < args.count_share:
                client.call("book", count=rng.choice((1, 2, 4)), start=start, end=end, note="bench")
            else:
                first = rng.randrange(0, 8)
                client.call("book", cards=sorted({first, (first + rng.randrange(0, 2)) % 8}), start=start, end=end,
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
    print(json.dumps({"user": me, "outcomes": outcomes, "latencies": latencies, "errors": errors[:5],
                      "cpu_s": time.process_time() - cpu0}), flush=True)


# -- the driver -------------------------------------------------------------------------------------------


def phase(mode: str, target: str, users: list[str], procs: int, args: argparse.Namespace, env: dict) -> dict:
    """Start `procs` workers (round-robin over users), release them together, collect their reports."""
    children = []
    for n in range(procs):
        argv = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--target", target,
                "--attempts", str(args.attempts), "--hours", str(args.hours), "--seed", str(n),
                "--count-share", str(args.count_share)]
        children.append(subprocess.Popen(as_user(users[n % len(users)], argv), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO))
    reports, wall = release_together(children, f"{mode} worker", timeout=600)
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
        "client_cpu_ms_per_attempt": round(sum(r["cpu_s"] for r in reports) * 1000 / total, 3),
    }


def rules_alone(scratch: Path, users: list[str], args: argparse.Namespace) -> dict:
    """The same attempts (the same seeds, one process after the other) through Service.call in this process, on a
    file of its own: what the rules cost with no socket, no threads and no other process. The service runs every
    operation on one database thread, so this is about the most it can do."""
    from app.config import Config
    from app.core.identity import Identity
    from app.errors import BadInput, Conflict, NotPermitted
    from app.service import open_service

    service = open_service(Config(db_path=scratch / "alone.db"), environ={"BOARD_SIMULATE": "1"})
    who = [Identity(u, pwd.getpwnam(u).pw_uid, False) for u in users]
    base = (int(time.time()) // HOUR + 1) * HOUR
    plans = []
    for n in range(args.procs):  # the workers' sequences, interleaved as they would arrive
        rng = random.Random(n)
        for k in range(args.attempts):
            start = base + HOUR * rng.randrange(0, args.hours)
            end = start + HOUR * rng.choice((1, 2, 3))
            if rng.random() < args.count_share:
                call = {"count": rng.choice((1, 2, 4)), "start": start, "end": end, "note": "bench"}
            else:
                first = rng.randrange(0, 8)
                call = {"cards": sorted({first, (first + rng.randrange(0, 2)) % 8}), "start": start, "end": end,
                        "note": "bench"}
            plans.append((k, n, call))
    plans.sort(key=lambda p: (p[0], p[1]))
    outcomes = {"booked": 0, "conflict": 0, "refused": 0, "error": 0}
    latencies = []
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    began = time.perf_counter()
    for _, n, call in plans:
        t0 = time.perf_counter()
        try:
            service.call(who[n % len(who)], "book", call)
            outcomes["booked"] += 1
        except Conflict:
            outcomes["conflict"] += 1
        except (NotPermitted, BadInput):
            outcomes["refused"] += 1
        latencies.append(time.perf_counter() - t0)
    wall = time.perf_counter() - began
    if profiler is not None:
        import pstats

        profiler.disable()
        print(f"rules alone, {len(plans)} attempts under cProfile (slower than unprofiled), by cumulative time:")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(r"app/", 30)
    service.close()
    latencies.sort()
    return {"attempts_per_s": round(len(plans) / wall, 1), "bookings_per_s": round(outcomes["booked"] / wall, 1),
            "p50_ms": round(statistics.median(latencies) * 1000, 2),
            "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2), "max_ms": round(latencies[-1] * 1000, 2),
            "outcomes": outcomes}


def verify(db: Path) -> dict:
    """The service's database, read-only, as root: overlaps among live bookings, integrity, the audit chain."""
    from app.store import events

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
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


def service_phase(install, users: list[str], args: argparse.Namespace, env: dict) -> dict:
    """The service's phase against `install`'s agent, with the agent's CPU over it (user + system, all threads)."""
    user0, system0 = cpu_seconds(install.agent_pid, split=True)
    board = phase("service", str(install.socket), users, args.procs, args, env)
    user1, system1 = cpu_seconds(install.agent_pid, split=True)
    cpu = user1 - user0 + system1 - system0
    board["agent_system_share"] = round((system1 - system0) / cpu, 2) if cpu else None  # the kernel's part
    # per second of the phase: near 1.0, the agent's one interpreter (the GIL) is the limit
    board["agent_cpu_per_s"] = round(cpu / board["wall_s"], 2)
    board["agent_cpu_ms_per_attempt"] = round(cpu * 1000 / board["attempts"], 3)
    return board


def run(args: argparse.Namespace) -> dict:
    from app.store.db import connect

    require_root("bench_load.py")
    users = [u for u in args.users.split(",") if u]
    for user in users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            raise SystemExit(f"no user {user!r}: create the users (useradd) or pick others with --users") from None
    if args.against is not None and not (args.against / ".venv" / "bin" / "board").exists():
        raise SystemExit(f"--against: no {args.against}/.venv/bin/board (make .venv there first)")
    with contextlib.ExitStack() as stack:
        install = stack.enter_context(shared_install(group=args.group))
        install.run(users[0], "status", check=True)  # opens (and migrates) the service's database
        other = None
        if args.against is not None:
            other = stack.enter_context(shared_install(group=args.group, board=args.against / ".venv" / "bin" / "board"))
            other.run(users[0], "status", check=True)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(install.root), "TZ": "UTC"}
        # The raw loop's file: a group directory beside the service's, on the same disk, the board's pragmas.
        scratch = install.root / "raw"
        scratch.mkdir()
        os.chown(scratch, 0, grp.getgrnam(args.group).gr_gid)
        os.chmod(scratch, 0o2770)
        raw = scratch / "raw.db"
        conn = connect(raw)
        conn.execute("CREATE TABLE raw (id INTEGER PRIMARY KEY, user TEXT, uid INTEGER, starts_at INTEGER,"
                     " ends_at INTEGER, note TEXT)")
        conn.close()
        for path in scratch.iterdir():
            os.chown(path, 0, grp.getgrnam(args.group).gr_gid)
            os.chmod(path, 0o660)
        # The raw loop before and after the service's run; the faster of the two is the floor (the stricter
        # test: a short raw run is at the mercy of whatever else the machine is doing).
        floors = [phase("raw", str(raw), users, args.procs, args, env)]
        if other is not None and args.theirs_first:
            against = service_phase(other, users, args, env)
            board = service_phase(install, users, args, env)
        else:
            board = service_phase(install, users, args, env)
            against = service_phase(other, users, args, env) if other is not None else None
        floors.append(phase("raw", str(raw), users, args.procs, args, env))
        stats = install.stats()
        checks = verify(install.db)
        if other is not None:
            against["checks"] = verify(other.db)
            against["ratio"] = None  # below, against the same floor
        alone = rules_alone(scratch, users, args)
    floor = max(floors, key=lambda f: f["attempts_per_s"])
    floor["runs_attempts_per_s"] = [f["attempts_per_s"] for f in floors]
    ratio = board["attempts_per_s"] / floor["attempts_per_s"]
    checked = [(board, checks)]
    if against is not None:
        checked.append((against, against["checks"]))
        against["ratio"] = round(against["attempts_per_s"] / floor["attempts_per_s"], 3)
        against["checkout"] = str(args.against)
    return {
        "hours": args.hours,
        "count_share": args.count_share,
        "board": board,
        "raw": floor,
        "rules_alone": alone,
        "against": against,
        "ratio": round(ratio, 3),
        "checks": checks,
        "service_max_rss_kib": stats["max_rss_kib"],
        "ok": all(c["overlaps"] == 0 and b["outcomes"]["error"] == 0 and c["integrity"] == "ok" and c["audit_chain_intact"]
                  for b, c in checked),
        "target_met": ratio >= 0.5,
    }


def print_table(result: dict) -> None:
    board, raw, checks = result["board"], result["raw"], result["checks"]
    print(f"{board['processes']} processes as {', '.join(board['users'])}; {board['attempts'] // board['processes']}"
          f" attempts each; 8 cards; starts within {result['hours']} h; {result['count_share']:.0%} of attempts ask"
          " for a count")
    print(f"{'':30} {'attempts/s':>10} {'bookings/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    rows = [("service (socket, board agent)", board)]
    if result["against"] is not None:
        rows.append((f"against: {Path(result['against']['checkout']).name}"[:30], result["against"]))
    rows += [("raw BEGIN IMMEDIATE insert", raw), ("rules alone: Service.call, 1 thread", result["rules_alone"])]
    for name, row in rows:
        print(f"{name:30} {row['attempts_per_s']:>10} {row['bookings_per_s']:>10} {row['p50_ms']:>8}"
              f" {row['p99_ms']:>8} {row['max_ms']:>8}")
    o = board["outcomes"]
    print(f"service outcomes: {o['booked']} booked, {o['conflict']} conflicts, {o['refused']} refused by policy,"
          f" {o['error']} unhandled errors" + (f" (first: {board['errors'][0]})" if board["errors"] else ""))
    print(f"the agent's CPU over its phase: {board['agent_cpu_per_s']} s per s, {board['agent_cpu_ms_per_attempt']} ms per"
          f" attempt ({board['agent_system_share']:.0%} in the kernel)")
    if (other := result["against"]) is not None:
        oc = other["checks"]
        print(f"against {other['checkout']}: {other['agent_cpu_per_s']} s per s, {other['agent_cpu_ms_per_attempt']} ms"
              f" per attempt ({other['agent_system_share']:.0%} in the kernel); {other['ratio']:.2f}x the raw loop;"
              f" {oc['overlaps']} overlaps, integrity {oc['integrity']},"
              f" audit chain {'intact' if oc['audit_chain_intact'] else 'BROKEN'}; outcomes {other['outcomes']}")
    print(f"checks (as root, read-only): {checks['overlaps']} overlaps, integrity {checks['integrity']}, audit chain"
          f" {'intact' if checks['audit_chain_intact'] else 'BROKEN'} ({checks['events']} events),"
          f" bookings by uids {checks['uids']}; service peak RSS {result['service_max_rss_kib'] / 1024:.1f} MB")
    print(f"the clients' CPU per attempt: service {board['client_cpu_ms_per_attempt']} ms, raw"
          f" {raw['client_cpu_ms_per_attempt']} ms")
    print(f"raw runs before and after the service's: {' and '.join(map(str, raw['runs_attempts_per_s']))} attempts/s;"
          " the faster is the floor")
    print(f"rules alone (the same attempts through Service.call in one thread, no socket): {result['rules_alone']['outcomes']}")
    print(f"service/raw attempts per second: {result['ratio']:.2f}x (target >= 0.5x:"
          f" {'met' if result['target_met'] else 'NOT met'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=32)
    parser.add_argument("--attempts", type=int, default=50)
    parser.add_argument("--hours", type=int, default=168,
                        help="starts are drawn from the next HOURS hours, on the hour (default 168: a week)")
    parser.add_argument("--count-share", type=float, default=0.5,
                        help="share of attempts that ask for a count (board book 2) rather than exact cards (default 0.5)")
    parser.add_argument("--users", default="alice,bob")
    parser.add_argument("--group", default=MEMBERS_GROUP, help=f"the members' group (default {MEMBERS_GROUP})")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--against", type=Path, help="another checkout (with its .venv): its agent's phase too, in the"
                        " same run, against the same raw floor")
    parser.add_argument("--theirs-first", action="store_true", help="with --against: the other checkout's phase first"
                        " (alternate it between runs: the order itself can favour one)")
    parser.add_argument("--profile", action="store_true",
                        help="print a cProfile of the rules-alone phase (where a booking attempt's time goes)")
    parser.add_argument("--worker", choices=("service", "raw"), dest="mode", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
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

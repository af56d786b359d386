"""Load on the service: 32 processes as two real users (alice and bob) book at once; no overlap, no unhandled error.

Each process is a real client of `board agent` (run as the system user board, as the unit runs
it): it connects to the socket as alice or bob and makes booking attempts over 8 cards and a few
hours, all of them released together. The service is the only writer; its database must then
hold no two live bookings that share a card at the same time, with the kernel's uid on each.

The old direct-file bench (bench/bench_load.py, every member writing the file) is kept working
below, small; its full run and figures are in the issue's closing note.
"""

from __future__ import annotations

import itertools
import json
import pwd
import subprocess
import sys


from tests.unix_users import MEMBERS_GROUP, REPO


PROCS, ATTEMPTS, HOURS = 32, 8, 6

WORKER = """
import json, random, sys, time
from app.client.socket import SocketClient
from app.config import load_config
from app.errors import BoardError, Conflict, NotPermitted

rng = random.Random(int(sys.argv[1]))
attempts, hours = int(sys.argv[2]), int(sys.argv[3])
client = SocketClient(load_config().service.socket)
client.call("whoami")  # connected before the go
base = (int(time.time()) // 3600 + 1) * 3600
print("ready", flush=True)
sys.stdin.readline()
outcomes = {"booked": 0, "conflict": 0, "refused": 0, "error": 0}
errors, latencies = [], []
for _ in range(attempts):
    start = base + 3600 * rng.randrange(0, hours)
    end = start + 3600 * rng.choice((1, 2, 3))
    began = time.perf_counter()
    try:
        if rng.random() < 0.5:
            client.call("book", start=start, end=end, count=rng.choice((1, 2, 4)), note="load")
        else:
            first = rng.randrange(8)
            client.call("book", start=start, end=end, cards=sorted({first, (first + rng.randrange(0, 2)) % 8}),
                        note="load")
        outcomes["booked"] += 1
    except Conflict:
        outcomes["conflict"] += 1
    except NotPermitted:
        outcomes["refused"] += 1  # the policy's cards-per-user limit
    except BoardError as error:
        outcomes["error"] += 1
        errors.append(str(error))
    latencies.append(time.perf_counter() - began)
print(json.dumps({"outcomes": outcomes, "errors": errors[:5], "latencies": latencies}), flush=True)
"""


def test_32_clients_as_two_real_users_book_at_once_through_the_service(board):
    users = ["alice", "bob"]
    workers = []
    try:
        for n in range(PROCS):
            workers.append(board.spawn(users[n % 2], str(n), str(ATTEMPTS), str(HOURS),
                                       program=[sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for worker in workers:
            line = worker.stdout.readline().strip()
            assert line == "ready", worker.stderr.read() if worker.poll() is not None else line
        for worker in workers:  # go
            worker.stdin.write("\n")
            worker.stdin.flush()
        results = []
        for worker in workers:
            out, err = worker.communicate(timeout=300)
            assert worker.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    total = {key: sum(r["outcomes"][key] for r in results) for key in ("booked", "conflict", "refused", "error")}
    assert sum(total.values()) == PROCS * ATTEMPTS
    assert total["error"] == 0, [e for r in results for e in r["errors"]]
    assert total["booked"] > 0 and total["conflict"] > 0, total  # they really contended
    assert board.agent_alive()

    live = board.rows("SELECT b.id, b.uid, b.starts_at, b.ends_at, c.card_uuid FROM bookings b"
                      " JOIN booking_cards c ON c.booking_id = b.id WHERE b.status = 'booked'")
    assert len({row[0] for row in live}) == total["booked"]
    overlaps = [(a[0], b[0]) for a, b in itertools.combinations(live, 2)
                if a[4] == b[4] and a[0] != b[0] and a[2] < b[3] and b[2] < a[3]]
    assert overlaps == []
    uids = sorted({row[1] for row in live})
    assert uids == sorted(pwd.getpwnam(u).pw_uid for u in users)
    created = board.rows("SELECT count(*) FROM events WHERE action = 'create' AND ok = 1")
    assert created == [(total["booked"],)]  # one audit event per booking, none lost in the rush
    doctor = board.run("root", "doctor")
    assert "integrity: ok" in doctor.stdout and "audit chain intact" in doctor.stdout, doctor.stdout
    assert doctor.returncode == 0 and "FIX" not in doctor.stdout, doctor.stdout  # one owner, 0700/0600, no links


def test_bench_load_small_run_as_two_real_users(unix_users):
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_load.py"), "--procs", "6", "--attempts", "15", "--hours", "24",
         "--users", "alice,bob", "--group", MEMBERS_GROUP, "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(result.stdout)
    board, checks = figures["board"], figures["checks"]
    assert board["users"] == ["alice", "bob"]  # through the service, as the real users
    assert board["attempts"] == 90 and board["outcomes"]["error"] == 0, board["errors"]
    assert board["outcomes"]["booked"] > 0 and board["outcomes"]["conflict"] > 0  # they really contended
    assert checks["overlaps"] == 0 and checks["integrity"] == "ok" and checks["audit_chain_intact"]
    assert checks["uids"] == sorted(unix_users[u].pw_uid for u in ("alice", "bob"))
    assert figures["raw"]["attempts"] == 90 and figures["ratio"] > 0

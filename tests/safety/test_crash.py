"""kill -9 in the middle of multi-card bookings: the file stays whole, no booking is half there, none overlap.

Each iteration forks a few real writer processes that book 2, 4 or 8 cards (and cancel and extend)
through BookingService as fast as they can, then SIGKILLs every one of them after a random delay.
Half the writers run with an SQLite progress handler that yields the CPU every few hundred VM
steps: the same statements, only slower, so that more kills land inside a transaction. Each
writer reports through shared memory which statement it last started; each kill waits for a
point chosen at random (anywhere, in a transaction, after a booking's first write), so that the
kills land inside transactions on a loaded machine too, and the test counts how many hit a
booking half-way (after its INSERT, before its COMMIT returned).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import random
import signal
import time

import pytest

from app.core.identity import Identity
from app.store.db import connect
from tests.conftest import FROZEN_NOW
from tests.safety.writers import BEGUN, COMMITTING, CONFIG, IDLE, WROTE, check, spawn

ITERATIONS = int(os.environ.get("BOARD_CRASH_ITERATIONS", "200"))
WRITERS = 3
# What a kill waits for: any point, inside a transaction, after a booking's first write. Aimed rather than timed,
# so that on a loaded machine (slow writers) the kills still land where the test means them to.
AIMS = ((IDLE, BEGUN, WROTE, COMMITTING), (BEGUN, WROTE, COMMITTING), (WROTE, COMMITTING), (WROTE, COMMITTING))


def wait_for(state, slot: int, states: tuple[int, ...], seconds: float = 2.0) -> None:
    """Until the writer's last statement is one of `states`; a writer that never gets there is killed anyway."""
    deadline = time.monotonic() + seconds
    while state[slot] not in states and time.monotonic() < deadline:
        time.sleep(0.0002)


def test_kill_9_mid_booking_leaves_no_partial_booking_and_no_overlap(tmp_path):
    db_path = tmp_path / "board.db"
    connect(db_path).close()
    context = multiprocessing.get_context("fork")
    state = context.RawArray(ctypes.c_int, WRITERS)
    rng = random.Random(20261129)
    kills, mid_booking, counts, seen = 0, 0, {}, {}
    started = time.monotonic()
    for iteration in range(ITERATIONS):
        for slot in range(WRITERS):
            state[slot] = -1  # not yet connected
        pids = [spawn(db_path, iteration * WRITERS + slot, state, slot) for slot in range(WRITERS)]
        # Kill writers that are writing: opening the file first takes a machine-dependent while.
        deadline = time.monotonic() + 10
        while any(state[slot] == -1 for slot in range(WRITERS)) and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(rng.uniform(0.01, 0.04))
        for slot, pid in enumerate(pids):
            wait_for(state, slot, rng.choice(AIMS))
            last = state[slot]  # read once: the writer runs on while it is counted
            os.kill(pid, signal.SIGKILL)
            seen[last] = seen.get(last, 0) + 1
            mid_booking += last in (WROTE, COMMITTING)
            kills += 1
            if rng.random() < 0.5:
                time.sleep(rng.uniform(0, 0.004))  # let the others run on past their first victim
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        counts = check(db_path)
    elapsed = time.monotonic() - started
    print(f"{ITERATIONS} iterations, {kills} kill -9s, {mid_booking} between a first write and COMMIT,"
          f" {counts} in {elapsed:.1f} s; states {seen}")
    assert kills >= 200 * WRITERS or ITERATIONS < 200
    assert counts["bookings"] > ITERATIONS, "the writers hardly wrote anything; the test proves little"
    in_transaction = sum(n for s, n in seen.items() if s in (BEGUN, WROTE, COMMITTING))
    assert in_transaction >= kills // 2, f"only {in_transaction} of {kills} kills landed inside a transaction"
    assert mid_booking >= ITERATIONS // 5, f"only {mid_booking} kills landed between a first write and its commit"
    # And the file is still a working board: one more booking goes in.
    conn = connect(db_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


@pytest.mark.parametrize("point", ["after-insert", "before-commit"])
def test_a_writer_killed_at_a_chosen_point_leaves_nothing(tmp_path, point):
    """The deterministic version: stop a writer at an exact statement with SIGSTOP, then kill -9 it."""
    db_path = tmp_path / "board.db"
    connect(db_path).close()
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        try:
            from app.service.rules.bookings import BookingService
            from app.gpu import open_source

            conn = connect(db_path)
            target = "INSERT INTO BOOKING_CARDS" if point == "after-insert" else "COMMIT"

            def trace(sql: str) -> None:
                if sql.lstrip().upper().startswith(target):
                    ready.set()
                    os.kill(os.getpid(), signal.SIGSTOP)

            conn.set_trace_callback(trace)
            fleet = open_source(True, clock=lambda: FROZEN_NOW).read()
            service = BookingService(conn, Identity("w", 5000, False), CONFIG, fleet.cards, fleet.topology,
                                     clock=lambda: FROZEN_NOW)
            service.create(count=4, start=FROZEN_NOW + 3600, end=FROZEN_NOW + 7200, note="want=4", request={"want": 4})
        finally:
            os._exit(0)
    assert ready.wait(30)
    time.sleep(0.05)
    # Another process must still be able to read, and, once the killed writer is gone, to write.
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert check(db_path)["bookings"] == 0
    conn = connect(db_path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    finally:
        conn.close()

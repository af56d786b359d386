"""Group commit (app.service.writer): bookings that wait together share one transaction, each audited and refused on
its own; a refusal rolls back to its own savepoint only. A real service on a real SQLite file, the simulated fleet."""

from __future__ import annotations

import sqlite3
import threading
import time

from app.config import Config
from app.core.identity import Identity
from app.errors import Conflict
from app.service import open_service
from app.service.writer import DatabaseThread
from app.store import events

H = 3600
ALICE, BOB = Identity("alice", 1001, False), Identity("bob", 1002, False)


def test_bookings_that_wait_together_commit_together_and_a_refusal_keeps_its_neighbours(tmp_path):
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    database = DatabaseThread(service)
    start = (int(time.time()) // H + 24) * H  # tomorrow, clear of the simulated fleet's squatters
    gate, statements = threading.Event(), []
    database.submit(gate.wait)  # holds the thread while the bookings queue up behind it
    database.submit(lambda: service.conn.set_trace_callback(statements.append))
    asked = [
        (ALICE, {"cards": [0], "start": start, "end": start + H}),
        (BOB, {"cards": [0], "start": start, "end": start + H}),  # refused: its neighbour just took card 0
        (BOB, {"cards": [1], "start": start, "end": start + H}),
        (ALICE, {"cards": [1, 2], "start": start, "end": start + H}),  # refused: card 1
        (BOB, {"count": 2, "start": start, "end": start + H}),  # two of the cards its neighbours left
    ]
    futures = [database.call(me, "book", args) for me, args in asked]
    gate.set()
    outcomes = [f.exception() or f.result() for f in futures]
    database.submit(lambda: service.conn.set_trace_callback(None)).result()
    database.shutdown()
    service.close()

    assert [isinstance(o, Conflict) for o in outcomes] == [False, True, False, True, False]
    assert "card 0 is booked by alice" in outcomes[1].args[0] and "card 1 is booked by bob" in outcomes[3].args[0]
    made = [o for o in outcomes if isinstance(o, dict)]
    assert len({c for o in made for c in o["cards"]}) == 4  # 0, 1 and two others: no overlap
    # One transaction for the five, a savepoint each.
    assert sum(s.startswith("BEGIN") for s in statements) == 1 and statements.count("COMMIT") == 1
    assert statements.count("SAVEPOINT nested") == 5

    conn = sqlite3.connect(tmp_path / "board.db")
    try:
        live = conn.execute("SELECT id, user FROM bookings WHERE status = 'booked' ORDER BY id").fetchall()
        assert [(i, u) for i, u in live] == [(o["id"], o["user"]) for o in made]  # the refusals kept their neighbours
        audit = conn.execute("SELECT actor, action, ok, booking_id FROM events ORDER BY id").fetchall()
        assert audit == [("alice", "create", 1, made[0]["id"]), ("bob", "create", 0, None),
                         ("bob", "create", 1, made[1]["id"]), ("alice", "create", 0, None),
                         ("bob", "create", 1, made[2]["id"])]
        assert events.first_broken(conn) is None
    finally:
        conn.close()


def test_an_operation_between_bookings_keeps_its_place_in_the_order(tmp_path):
    """Only bookings next to each other in the queue share a transaction: what comes between runs between them."""
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    database = DatabaseThread(service)
    start = (int(time.time()) // H + 24) * H
    gate = threading.Event()
    database.submit(gate.wait)
    first = database.call(ALICE, "book", {"cards": [4], "start": start, "end": start + H})
    listed = database.call(ALICE, "list", {"start": start})
    second = database.call(ALICE, "book", {"cards": [5], "start": start, "end": start + H})
    gate.set()
    assert [b["id"] for b in listed.result()["bookings"]] == [first.result()["id"]]
    assert second.result()["cards"] == [5]
    database.shutdown()
    service.close()


def test_a_refusal_in_a_group_reads_again_only_what_its_own_savepoint_undid(tmp_path):
    """A refusal rolls back to its own savepoint: the calendar in memory reads again what changed since then (nothing,
    for a conflict), not every booking its neighbours made before it in the same transaction. So a group's refusals
    cost the same however many bookings the group made before them: each booking made is read back at most twice (its
    answer, and the calendar's copy), a refusal nothing."""
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    database = DatabaseThread(service)
    start = (int(time.time()) // H + 24) * H
    gate, statements = threading.Event(), []
    # Bookings before the group: the cards' rows are written and the calendar read, as on a running service.
    for hour in (9, 10):
        database.call(ALICE, "book", {"cards": [7], "start": start + hour * H, "end": start + (hour + 1) * H}).result()
    database.submit(gate.wait)
    database.submit(lambda: service.conn.set_trace_callback(statements.append))
    futures = []
    for k in range(12):  # a booking, then a refusal of the same slot, twelve times in one group
        slot = {"cards": [k % 8], "start": start + (k // 8) * H, "end": start + (k // 8 + 1) * H}
        futures += [database.call(ALICE, "book", slot), database.call(BOB, "book", slot)]
    gate.set()
    outcomes = [f.exception() or f.result() for f in futures]
    database.submit(lambda: service.conn.set_trace_callback(None)).result()
    database.shutdown()
    service.close()
    assert [isinstance(o, Conflict) for o in outcomes] == [False, True] * 12
    assert sum(s.startswith("BEGIN") for s in statements) == 1
    reads = [s for s in statements if "FROM bookings" in s]
    assert all("WHERE b.id = " in s for s in reads), reads  # one booking at a time: the calendar is never read whole
    # Before the group, the calendar's copy of the booking made just before it; the group's last, after the group.
    assert len(reads) <= 2 * 12 + 1, reads


def test_each_booking_of_a_group_is_answered_in_the_order_asked_once_the_group_is_committed(tmp_path):
    """A group's answers go out in the order the bookings were asked, and only after its COMMIT: a member told
    "booked" who looks at once (another connection to the file, as `board list` from another process) finds it there.

    Wrong versions it fails on: each booking answered as soon as it ran, inside the open transaction; the answers
    settled in another order than asked."""
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    database = DatabaseThread(service)
    start = (int(time.time()) // H + 24) * H
    gate = threading.Event()
    database.submit(gate.wait)
    reader = sqlite3.connect(tmp_path / "board.db", check_same_thread=False)
    answered: list[tuple[int, object]] = []  # (which, what another connection saw of it then), as each is answered

    def seen(which: int, future) -> None:
        made = future.exception() or future.result()
        row = (reader.execute("SELECT status FROM bookings WHERE id = ?", (made["id"],)).fetchone()
               if isinstance(made, dict) else made)
        answered.append((which, row if isinstance(row, tuple) or row is None else type(row).__name__))

    asked = [(ALICE, [3]), (BOB, [3]), (BOB, [4]), (ALICE, [6])]  # Bob's first refused: card 3 was just taken
    futures = [database.call(me, "book", {"cards": cards, "start": start, "end": start + H}) for me, cards in asked]
    for which, future in enumerate(futures):
        future.add_done_callback(lambda f, which=which: seen(which, f))
    gate.set()
    for future in futures:
        future.exception()
    database.shutdown()
    service.close()
    reader.close()
    assert answered == [(0, ("booked",)), (1, "Conflict"), (2, ("booked",)), (3, ("booked",))]

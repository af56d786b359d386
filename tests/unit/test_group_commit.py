"""Group commit (app.service.door.writer): bookings that wait together share one transaction, each audited and refused on
its own; a refusal rolls back to its own savepoint only. A real service on a real SQLite file, the simulated fleet."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from app.config import Config
from app.core.identity import Identity
from app.errors import Conflict
from app.service import open_service
from app.service.door.writer import MAX_GROUP, DatabaseThread
from app.store import events
from app.store.db import StoreError

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


def test_a_group_holds_at_most_max_group_bookings_and_the_next_one_opens_the_next_transaction(tmp_path):
    """MAX_GROUP + 1 bookings waiting together: the first MAX_GROUP share one transaction, the last has its own.
    Wrong versions: the cap off by one either way (one transaction of MAX_GROUP + 1, or MAX_GROUP - 1 and two), no cap."""
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    database = DatabaseThread(service)
    start = (int(time.time()) // H + 24) * H
    gate, statements = threading.Event(), []
    database.submit(gate.wait)
    database.submit(lambda: service.conn.set_trace_callback(statements.append))
    futures = [database.call((ALICE, BOB)[i % 2], "book", {"cards": [i % 8], "start": start + (i // 8) * H,
                                                          "end": start + (i // 8 + 1) * H})
               for i in range(MAX_GROUP + 1)]
    gate.set()
    made = [f.result() for f in futures]
    database.submit(lambda: service.conn.set_trace_callback(None)).result()
    database.shutdown()
    service.close()

    assert len({b["id"] for b in made}) == MAX_GROUP + 1
    assert sum(s.startswith("BEGIN") for s in statements) == 2 and statements.count("COMMIT") == 2
    first_commit = statements.index("COMMIT")  # a group's bookings have a savepoint each; one alone needs none
    assert statements[:first_commit].count("SAVEPOINT nested") == MAX_GROUP
    assert statements[first_commit:].count("SAVEPOINT nested") == 0


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


def fail_once(service, statement: str, *, nth: int = 1, full: bool = False) -> list[str]:
    """Run on the database thread: its connection fails the `nth` statement that starts with `statement`, once, as
    SQLite fails it: an I/O error (the statement not run), or with `full` a full disk, after which SQLite has ended the
    transaction by itself. The fake drives the failure; what runs is the real writer on the real file. Returns the
    statements seen."""
    conn, seen = service.conn, []
    real = conn.execute

    def execute(sql, *args):
        seen.append(sql)
        if sql.startswith(statement) and sum(s.startswith(statement) for s in seen) == nth:
            if full:
                real("ROLLBACK")
                raise sqlite3.OperationalError("database or disk is full")
            raise sqlite3.OperationalError("disk I/O error")
        return real(sql, *args)

    conn.execute = execute  # BoardConnection keeps a __dict__: this connection's execute only
    return seen


def live_and_audit(path) -> tuple[list[tuple], list[tuple]]:
    conn = sqlite3.connect(path)
    try:
        live = conn.execute("SELECT b.id, b.user, count(c.card_uuid) FROM bookings AS b LEFT JOIN booking_cards AS c"
                            " ON c.booking_id = b.id WHERE b.status = 'booked' GROUP BY b.id ORDER BY b.id").fetchall()
        audit = conn.execute("SELECT actor, action, ok, booking_id FROM events ORDER BY id").fetchall()
        assert events.first_broken(conn) is None
        return live, audit
    finally:
        conn.close()


def queued(service, asked: list[tuple[Identity, dict]], fault) -> tuple[DatabaseThread, list, list[str]]:
    """`asked`'s bookings queued behind a held database thread, then let go together: one group; their outcomes, and
    the statements the thread ran (`fault`, fail_once's arguments, set on its connection first)."""
    database = DatabaseThread(service)
    seen = database.submit(lambda: fail_once(service, *fault[:1], **fault[1])).result()
    gate = threading.Event()
    database.submit(gate.wait)
    futures = [database.call(me, "book", args) for me, args in asked]
    gate.set()
    return database, [f.exception() or f.result() for f in futures], seen


def test_a_group_whose_commit_fails_answers_each_booking_on_its_own_and_the_next_group_commits(tmp_path):
    """The group's COMMIT fails (an I/O error): nothing of the group was saved, so each booking runs again on its own
    and gets its own answer (made, or refused for its neighbour's card), with one audit row each and nothing twice;
    the group after it commits as one again.
    Wrong versions: every booking answered with the COMMIT's error; the answers of the failed transaction kept (they
    name bookings that were never saved); the group's audit rows left beside the second run's."""
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    start = (int(time.time()) // H + 24) * H  # tomorrow, clear of the simulated fleet's squatters
    database, outcomes, seen = queued(service, [
        (ALICE, {"cards": [0], "start": start, "end": start + H}),
        (BOB, {"cards": [0], "start": start, "end": start + H}),  # refused: alice's card 0
        (BOB, {"cards": [1], "start": start, "end": start + H}),
        (ALICE, {"cards": [2, 3], "start": start, "end": start + H}),
    ], ("COMMIT", {}))
    assert [isinstance(o, Conflict) for o in outcomes] == [False, True, False, False], outcomes
    assert "card 0 is booked by alice" in outcomes[1].args[0]
    made = [o for o in outcomes if isinstance(o, dict)]
    # The group's one BEGIN and failed COMMIT, then a transaction each.
    assert sum(s.startswith("BEGIN") for s in seen) == 5 and seen.count("COMMIT") == 5, seen
    live, audit = live_and_audit(tmp_path / "board.db")
    assert live == [(o["id"], o["user"], len(o["cards"])) for o in made] and len(live) == 3  # each once, whole
    assert audit == [("alice", "create", 1, made[0]["id"]), ("bob", "create", 0, None),
                     ("bob", "create", 1, made[1]["id"]), ("alice", "create", 1, made[2]["id"])]

    seen.clear()
    later = [database.call(BOB, "book", {"cards": [c], "start": start + H, "end": start + 2 * H}) for c in (0, 1)]
    assert [f.result()["cards"] for f in later] == [[0], [1]]
    database.shutdown()
    service.close()
    assert len(live_and_audit(tmp_path / "board.db")[0]) == 5


def test_a_group_that_sqlite_ends_midway_runs_each_booking_again_on_its_own(tmp_path):
    """The disk fills at the second booking's insert and SQLite ends the group's transaction by itself: the first
    booking is gone with it, so the writer stops the group there and runs each booking again on its own, the third
    too (which would otherwise begin and commit a transaction of its own inside the group's, and run twice).
    Wrong versions: the check that the transaction still stands dropped (the third booking made twice, or refused
    against itself); the first booking's answer from the lost transaction kept."""
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    start = (int(time.time()) // H + 24) * H
    database, outcomes, _ = queued(service, [(ALICE, {"cards": [c], "start": start, "end": start + H})
                                             for c in (4, 5, 6)], ("INSERT INTO bookings", {"nth": 2, "full": True}))
    database.shutdown()
    service.close()
    assert [o["cards"] for o in outcomes] == [[4], [5], [6]], outcomes
    live, audit = live_and_audit(tmp_path / "board.db")
    assert live == [(o["id"], "alice", 1) for o in outcomes]
    assert audit == [("alice", "create", 1, o["id"]) for o in outcomes]


def test_a_group_whose_begin_fails_answers_every_booking_with_that_error_and_the_thread_goes_on(tmp_path):
    """The group's BEGIN IMMEDIATE fails (an I/O error): nothing ran, so every booking of the group is answered with
    the store's error, and the thread answers what comes next. Settled before shutdown's join returns.
    Wrong versions: the outcomes not made for the whole batch (the thread dies, the members wait for ever)."""
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    start = (int(time.time()) // H + 24) * H
    database = DatabaseThread(service)
    seen = database.submit(lambda: fail_once(service, "BEGIN")).result()
    gate = threading.Event()
    database.submit(gate.wait)
    futures = [database.call(ALICE, "book", {"cards": [c], "start": start, "end": start + H}) for c in (4, 5, 6)]
    after = database.call(BOB, "list", {"start": start})  # not a booking: runs alone, after the group
    gate.set()
    database.shutdown(wait=True)  # the thread has run everything queued (or died): no future is waited on
    service.close()
    assert all(f.done() for f in [*futures, after])
    outcomes = [f.exception() for f in futures]
    assert [type(o) for o in outcomes] == [StoreError] * 3 and len({str(o) for o in outcomes}) == 1, outcomes
    assert sum(s.startswith("BEGIN") for s in seen) == 1 and "COMMIT" not in seen
    assert after.result()["bookings"] == []
    assert live_and_audit(tmp_path / "board.db") == ([], [])


def test_only_bookings_share_a_transaction_other_writes_waiting_together_have_one_each(tmp_path):
    """Two cancels waiting together run one after the other, each in its own transaction, never as a group.
    Wrong version: every operation named by a string grouped (the cancels in one BEGIN ... COMMIT)."""
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    database = DatabaseThread(service)
    start = (int(time.time()) // H + 24) * H
    made = [database.call(ALICE, "book", {"cards": [c], "start": start, "end": start + H}).result()["id"]
            for c in (0, 1)]
    gate, statements = threading.Event(), []
    database.submit(gate.wait)
    database.submit(lambda: service.conn.set_trace_callback(statements.append))
    futures = [database.call(ALICE, "cancel", {"id": i}) for i in made]
    gate.set()
    [f.result() for f in futures]
    database.submit(lambda: service.conn.set_trace_callback(None)).result()
    database.shutdown(wait=True)
    service.close()
    assert sum(s.startswith("BEGIN") for s in statements) == 2 and statements.count("COMMIT") == 2, statements


def test_the_database_thread_keeps_no_process_alive_and_refuses_work_once_stopped(tmp_path):
    """The agent's process may end without its shutdown (a crash on the main thread): the database thread must not
    hold it open. After shutdown, a call is refused in words.
    Wrong versions: a non-daemon thread (the process hangs at exit); the refusal's words changed."""
    service = open_service(Config(db_path=tmp_path / "board.db"), environ={"BOARD_SIMULATE": "1"})
    before = set(threading.enumerate())
    database = DatabaseThread(service)
    started = set(threading.enumerate()) - before
    assert started and [t for t in started if not t.daemon] == []
    database.shutdown(wait=True)
    with pytest.raises(RuntimeError) as refused:
        database.call(ALICE, "list", {})
    assert str(refused.value) == "the database thread has stopped"
    service.close()

"""The PostgreSQL store itself (app.store.pg, app.store.pg_schema): what the rules' tests, run on both stores, do not
show. Those that need a server take `pg_cluster` (the `postgresql` tier); the refusals that need none run everywhere."""

from __future__ import annotations

import json
import os
import queue
import re
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from app.client.local import LocalClient
from app.config import Config, ConfigError, PostgresStore, load_config
from app.core.identity import Identity, current_identity
from app.errors import BadInput, BoardError, Conflict
from app.service.rules.bookings import BookingService
from app.gpu import open_source
from app.store import events, schema
from app.store.db import StoreError, connect, write
from app.store import pg as pg_module
from app.store.pg import PgConnection, StoreUnreachable, _password, clock_offset, lock_keys, translate
from tests.conftest import FROZEN_NOW, postgresql_only, run_board
from tests.postgres import Cluster, missing_reason

NOWHERE = "postgresql:///board?host=/nonexistent/board-test&user=postgres"


# -- without a server -----------------------------------------------------------------------------------------


CARD_1, CARD_2 = "GPU-00000000-0000-0000-0000-000000000001", "GPU-00000000-0000-0000-0000-000000000002"


def test_a_writes_locks_are_its_cards_in_key_order_then_its_user_the_same_on_every_host():
    """Every writer takes its locks in one order (no deadlock), and every host and version derives the same key from a
    name: pinned numbers, not Python's per-process hash (two hosts must wait for each other on one card)."""
    card, user = pg_module.CARD_LOCK, pg_module.USER_LOCK
    assert lock_keys([CARD_2, CARD_1, CARD_2], "alice") == [(card, -2073135853), (card, -1359069381), (user, 1842297945)]
    assert lock_keys([CARD_2], None) == [(card, -1359069381)]
    assert lock_keys([], "alice") == [(user, 1842297945)]



def test_the_url_comes_from_the_config_or_board_db_url(tmp_path):
    config = tmp_path / "board.toml"
    config.write_text(f'[storage]\ndb = "{tmp_path}/board.db"\nurl = "{NOWHERE}"\npassword_file = "{tmp_path}/pw"\n')
    loaded = load_config(environ={"BOARD_CONFIG": str(config)})
    assert loaded.store == PostgresStore(NOWHERE, tmp_path / "pw", os.uname().nodename.split(".")[0])
    assert load_config(environ={"BOARD_CONFIG": str(config), "BOARD_DB_URL": "postgresql://db1/b"}).store.url == \
        "postgresql://db1/b"
    assert Config().store == Config().db_path  # no url: SQLite, as before
    config.write_text('[storage]\nurl = "mysql://db1/board"\n')
    with pytest.raises(ConfigError, match=r"\[storage\] url must be a PostgreSQL URI"):
        load_config(environ={"BOARD_CONFIG": str(config)})


def test_an_unreachable_database_is_one_line_exit_1_for_a_write(tmp_path):
    result = run_board("book", "--cards", "0", "--for", "1h",
                       env={"BOARD_DB_URL": NOWHERE, "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1",
                            "HOME": str(tmp_path)})
    host = os.uname().nodename.split(".")[0]
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"board: the board database is unreachable ({host} → /nonexistent/board-test:5432);"
                             " nothing was changed\n")


def test_the_password_file_must_be_the_readers_own_and_private(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    os.chmod(secret, 0o600)
    assert _password(secret) == "s3cret"
    os.chmod(secret, 0o640)
    with pytest.raises(BadInput) as refused:
        _password(secret)
    assert "\n" not in str(refused.value) and "mode 0600 or 0400; it is 0640" in str(refused.value)
    os.chmod(secret, 0o400)
    os.chown(secret, 65534, -1)  # nobody's
    with pytest.raises(BadInput, match="must be owned by this user"):
        _password(secret)
    with pytest.raises(BadInput, match="password_file"):  # refused before anything is asked of the network
        connect(PostgresStore(NOWHERE, secret, "gpu1"))


def test_board_backup_points_at_pg_dump(tmp_path):
    result = run_board("backup", str(tmp_path / "copy.db"), env={"BOARD_DB_URL": NOWHERE, "HOME": str(tmp_path),
                                                                 "BOARD_DB": str(tmp_path / "board.db")})
    assert result.returncode == 2 and "pg_dump" in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "copy.db").exists()


def test_the_translation_is_placeholders_begin_and_returning_id_only():
    assert translate("SELECT 1 FROM bookings WHERE id = ? AND note LIKE '%?%'") == (
        "SELECT 1 FROM bookings WHERE id = %s AND note LIKE '%%?%%'", False)
    assert translate("BEGIN IMMEDIATE") == ("BEGIN", False)
    assert translate('INSERT INTO bookings ("user") VALUES (?)') == ('INSERT INTO bookings ("user") VALUES (%s) RETURNING id',
                                                                      True)
    assert translate("INSERT INTO jobs (pid) VALUES (?)") == ("INSERT INTO jobs (pid) VALUES (%s)", False)
    # A bare `user` would read the role's name on PostgreSQL: refused, so a test on PostgreSQL finds it.
    with pytest.raises(sqlite3.ProgrammingError, match='write "user"'):
        translate("SELECT user FROM bookings")


# -- on a server ------------------------------------------------------------------------------------------------


def _columns_sqlite(tmp_path) -> dict[str, set[str]]:
    conn = connect(tmp_path / "board.db")
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    found = {t: {c[1] for c in conn.execute(f"PRAGMA table_info({t})")} for t in tables}
    conn.close()
    return found


@postgresql_only
def test_the_postgresql_schema_has_every_table_and_column_of_sqlites_latest(conn, tmp_path):
    found: dict[str, set[str]] = {}
    for table, column in conn.execute("SELECT table_name, column_name FROM information_schema.columns"
                                      " WHERE table_schema = 'public'"):
        found.setdefault(table, set()).add(column)
    for table, columns in _columns_sqlite(tmp_path).items():
        assert table in found, f"table {table} (app.store.schema) is missing from app.store.pg_schema"
        assert columns <= found[table], f"{table}: {columns - found[table]} missing from app.store.pg_schema"
    assert schema.LATEST >= 12  # app.store.schema's migrations up to server plans are mirrored; add later ones too


def answers_again(conn: PgConnection) -> None:
    """Wait until `conn` reconnects: its backoff is 1 s, then 2 s ..., and the next use after it connects."""
    deadline = time.monotonic() + 60
    while True:
        try:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            return
        except StoreUnreachable:
            assert time.monotonic() < deadline, "the connection never came back"
            time.sleep(0.1)


@pytest.fixture
def pg(pg_cluster):
    """A fresh PostgreSQL store on the worker's cluster (tests/postgres.py)."""
    url = pg_cluster.fresh_database()
    yield PostgresStore(url, host="gpu1")
    pg_cluster.drop(url)


def test_every_connection_sets_its_timeouts_durability_and_name(pg):
    conn = connect(pg)
    settings = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in (
        "statement_timeout", "idle_in_transaction_session_timeout", "synchronous_commit", "application_name")}
    assert settings == {"statement_timeout": "30s", "idle_in_transaction_session_timeout": "10s",
                        "synchronous_commit": "on", "application_name": "board gpu1"}
    assert abs(clock_offset(conn)) < 5  # the same machine's clock; doctor fails beyond a second
    conn.close()


def test_every_numbered_column_is_the_databases_alone(pg):
    """Each identity column (a table gaining one later included) carries the trigger that refuses an id a host's role
    chose (tests/integration/test_pg_row_security.py replays the attack), enabled; and only those columns do."""
    from app.store.pg_schema import DATABASE_IDS

    conn = connect(pg)
    numbered = set(conn.execute("SELECT table_name, column_name FROM information_schema.columns"
                                " WHERE table_schema = current_schema() AND is_identity = 'YES'").fetchall())
    guarded = set(conn.execute("SELECT c.relname, t.tgname FROM pg_trigger AS t JOIN pg_class AS c ON c.oid = t.tgrelid"
                               " WHERE t.tgname LIKE '%\\_by\\_database' AND t.tgenabled = 'O'").fetchall())
    conn.close()
    assert numbered == set(DATABASE_IDS.items())
    assert guarded == {(table, f"{table}_{column}_by_database") for table, column in DATABASE_IDS.items()}


def test_a_database_that_refuses_says_why_in_one_line(pg_cluster):
    with pytest.raises(BoardError) as refused:
        connect(PostgresStore(pg_cluster.url("no_such_board"), host="gpu1"))
    assert "refused gpu1" in str(refused.value) and 'database "no_such_board" does not exist' in str(refused.value)
    assert "\n" not in str(refused.value) and "unreachable" not in str(refused.value)


def test_the_first_service_makes_the_schema_and_a_newer_one_is_refused(pg_cluster):
    store = PostgresStore(pg_cluster.empty_database(), host="gpu1")
    conn = connect(store)  # makes it
    assert conn.execute("SELECT count(*) FROM bookings").fetchone()[0] == 0
    conn.execute("UPDATE board_schema SET version = version + 1")
    conn.close()
    with pytest.raises(StoreError) as refused:
        connect(store)
    assert "newer than this board" in str(refused.value) and "\n" not in str(refused.value)
    pg_cluster.drop(store.url)


@postgresql_only
def test_the_database_keeps_the_spans_in_step_and_refuses_overlaps_and_empty_ranges(make_service, conn):
    first = make_service().create(cards=[0], start=FROZEN_NOW, end=FROZEN_NOW + 3600)
    make_service().cancel(first.id)
    second = make_service().create(cards=[0], start=FROZEN_NOW, end=FROZEN_NOW + 3600)  # a cancelled span is free
    assert conn.execute("SELECT booking_id, live FROM booking_cards ORDER BY booking_id").fetchall() == [
        (first.id, False), (second.id, True)]
    with pytest.raises(sqlite3.IntegrityError, match="overlapping booking") as refused:  # bringing the first back
        with write(conn):
            conn.execute("UPDATE bookings SET status = 'booked' WHERE id = ?", (first.id,))
    assert refused.value.sqlstate == "23P01"
    with pytest.raises(sqlite3.IntegrityError) as refused:  # a span of nothing, written around the app
        with write(conn):
            conn.execute("ALTER TABLE booking_cards DISABLE TRIGGER booking_cards_span")
            conn.execute("UPDATE booking_cards SET span = 'empty' WHERE booking_id = ?", (second.id,))
    assert refused.value.sqlstate == "23514"  # the CHECK
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        with write(conn):
            conn.execute("DELETE FROM events")


def test_sixteen_writers_racing_for_one_card_make_one_booking_and_fifteen_clean_conflicts(pg, fleet):
    """Each writer on its own connection, as each host's service is: the write lock serialises them, the rules see the
    winner, and the audit chain stays one chain."""
    barrier = threading.Barrier(16)
    outcomes: queue.Queue = queue.Queue()

    def writer(uid: int) -> None:
        conn = connect(pg)
        rules = BookingService(conn, Identity(f"user{uid}", uid, False), Config(), fleet.cards, fleet.topology,
                               lambda: FROZEN_NOW)
        barrier.wait()
        try:
            outcomes.put(rules.create(cards=[2], start=FROZEN_NOW + 3600, end=FROZEN_NOW + 7200).id)
        except Exception as error:  # noqa: BLE001 - the test tallies them
            outcomes.put(error)
        finally:
            conn.close()

    threads = [threading.Thread(target=writer, args=(2000 + n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    results = [outcomes.get_nowait() for _ in range(16)]
    won = [r for r in results if isinstance(r, int)]
    lost = [r for r in results if not isinstance(r, int)]
    assert len(won) == 1 and len(lost) == 15, results
    assert all(isinstance(r, Conflict) and "\n" not in str(r) for r in lost), lost
    conn = connect(pg)
    assert events.first_broken(conn) is None
    assert conn.execute("SELECT count(*), sum(ok) FROM events").fetchone() == (16, 1)
    conn.close()


class Parked:
    """A booking's rules on their own connection, parked inside write() once its locks are taken: its clock, first read
    inside the transaction (the rules' own `now`), waits there until `go` is set."""

    def __init__(self, store: PostgresStore, fleet, name: str, uid: int) -> None:
        self.conn = connect(store)
        self.inside, self.go = threading.Event(), threading.Event()
        self.rules = BookingService(self.conn, Identity(name, uid, False), Config(), fleet.cards, fleet.topology,
                                    self._clock)
        self.outcome: queue.Queue = queue.Queue()

    def _clock(self) -> int:
        if self.conn.in_transaction and not self.inside.is_set():
            self.inside.set()
            assert self.go.wait(60), "never let go"
        return FROZEN_NOW

    def book(self, cards: list[int]) -> threading.Thread:
        def run() -> None:
            try:
                self.outcome.put(self.rules.create(cards=cards, start=FROZEN_NOW + 3600, end=FROZEN_NOW + 7200))
            except Exception as error:  # noqa: BLE001 - the test looks at it
                self.outcome.put(error)

        thread = threading.Thread(target=run)
        thread.start()
        assert self.inside.wait(60), "the booking never got inside its write"
        return thread


def _rules(store: PostgresStore, fleet, name: str, uid: int) -> BookingService:
    return BookingService(connect(store), Identity(name, uid, False), Config(), fleet.cards, fleet.topology,
                          lambda: FROZEN_NOW)


def test_bookings_on_different_cards_hold_their_transactions_at_once(pg, fleet, monkeypatch):
    """Alice's booking of card 0 is parked inside its write, locks taken; Bob books card 1 meanwhile, start to commit.
    A write on no named cards (the store's lock, exclusive) still waits for Alice's."""
    monkeypatch.setattr(pg_module, "LOCK_TIMEOUT_MS", 2000)  # the old single lock: Bob's refusal, not a hang
    alice = Parked(pg, fleet, "alice", 1001)
    thread = alice.book([0])
    bob = _rules(pg, fleet, "bob", 1002)
    made = bob.create(cards=[1], start=FROZEN_NOW + 3600, end=FROZEN_NOW + 7200)  # while Alice's is open
    assert alice.outcome.empty() and made.cards == (1,)
    monkeypatch.setattr(pg_module, "LOCK_TIMEOUT_MS", 200)
    admin = connect(pg)
    with pytest.raises(StoreError, match="stayed locked for 0.2 s"):
        with write(admin):
            admin.execute("SELECT 1")
    alice.go.set()
    thread.join(60)
    assert alice.outcome.get_nowait().cards == (0,)
    assert events.first_broken(admin) is None
    assert admin.execute("SELECT action, ok FROM events ORDER BY id").fetchall() == [("create", 1), ("create", 1)]
    for conn in (alice.conn, bob.conn, admin):
        conn.close()


@pytest.mark.parametrize("second", [("bob", 1002, [2]), ("bob", 1002, [3, 2]), ("alice", 1001, [5])],
                         ids=["same card", "one card shared", "same user"])
def test_bookings_on_the_same_card_or_by_the_same_user_wait_and_the_rules_see_the_first(pg, fleet, second):
    """Alice's booking of card 2 is parked inside its write; a second booking that shares a card with it, or is
    Alice's too (her limit on cards at once reads all hers), waits for its locks, then the rules decide on what Alice
    committed: a clean conflict on the card, or a booking of its own."""
    name, uid, cards = second
    alice = Parked(pg, fleet, "alice", 1001)
    thread = alice.book([2])
    other = Parked(pg, fleet, name, uid)
    other.go.set()
    watcher = connect(pg)
    late = threading.Thread(target=lambda: other.outcome.put(_book(other.rules, cards)))
    late.start()
    assert _waits_for_a_lock(watcher, late), "the second booking never waited"  # for one of Alice's
    assert other.outcome.empty()
    alice.go.set()
    thread.join(60)
    late.join(60)
    assert alice.outcome.get_nowait().cards == (2,)
    result = other.outcome.get_nowait()
    if 2 in cards:
        assert isinstance(result, Conflict) and "\n" not in str(result) and result.exit_code == 3, result
    else:
        assert result.cards == tuple(cards)
    assert events.first_broken(watcher) is None
    assert watcher.execute("SELECT count(*), sum(ok) FROM events").fetchone() == (2, 1 if 2 in cards else 2)
    for conn in (alice.conn, other.conn, watcher):
        conn.close()


def _waits_for_a_lock(watcher, thread: threading.Thread) -> bool:
    """Whether some connection waits for an advisory lock in the watcher's database before `thread` ends (60 s)."""
    deadline = time.monotonic() + 60
    while thread.is_alive() and time.monotonic() < deadline:
        if watcher.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database ="
                           " (SELECT oid FROM pg_database WHERE datname = current_database())").fetchone()[0]:
            return True
        time.sleep(0.01)
    return False


def test_writers_on_different_cards_append_to_the_audit_chain_one_after_the_other(pg):
    """Alice's write on one card has appended its event and not committed; Bob's, on another card, runs alongside up
    to his append, which waits for her commit and then links to her event. Had he read the chain's tail before her
    commit, both events would follow the same one: a fork that first_broken reports as tampering. (An append goes
    with the write's next round trip, usually its COMMIT: Alice's next statement sends hers here.)"""
    alice, bob, watcher = connect(pg), connect(pg), connect(pg)
    outcome: queue.Queue = queue.Queue()

    def bobs_write() -> None:
        try:
            with write(bob, cards=[CARD_2], user="bob"):
                events.record(bob, ts=FROZEN_NOW, uid=1002, actor="bob", action="create", booking_id=None, ok=True)
            outcome.put("committed")
        except Exception as error:  # noqa: BLE001 - the test looks at it
            outcome.put(error)

    with write(alice, cards=[CARD_1], user="alice"):
        events.record(alice, ts=FROZEN_NOW, uid=1001, actor="alice", action="create", booking_id=None, ok=True)
        alice.execute("SELECT 1")  # her append is sent with it, and she holds the chain to her commit
        bobs = threading.Thread(target=bobs_write)
        bobs.start()
        assert _waits_for_a_lock(watcher, bobs), f"Bob's append did not wait for Alice's: {outcome.queue}"
    bobs.join(60)
    assert outcome.get_nowait() == "committed"
    (first, _, first_hash), (second, second_prev, _) = watcher.execute(
        "SELECT actor, prev_hash, hash FROM events ORDER BY id").fetchall()
    assert (first, second, second_prev) == ("alice", "bob", first_hash)
    assert events.first_broken(watcher) is None
    for conn in (alice, bob, watcher):
        conn.close()


def _book(rules: BookingService, cards: list[int]):
    try:
        return rules.create(cards=cards, start=FROZEN_NOW + 3600, end=FROZEN_NOW + 7200)
    except Exception as error:  # noqa: BLE001 - the test looks at it
        return error


def test_writers_racing_for_overlapping_groups_of_cards_never_deadlock(pg, fleet):
    """Twenty-four writers, each on its own connection, book overlapping groups of cards named in any order (the
    locks are taken sorted) alongside writes on no named cards: every one books or gets a clean conflict, never a
    deadlock or the database's overlap error, and no two bookings share a card."""
    import random

    groups = [random.Random(n).sample(range(8), random.Random(n).randint(1, 3)) for n in range(24)]
    barrier = threading.Barrier(len(groups))
    outcomes: queue.Queue = queue.Queue()

    def writer(n: int) -> None:
        rules = _rules(pg, fleet, f"user{n % 3}", 2000 + n % 3)
        barrier.wait()
        outcomes.put(_book(rules, groups[n]) if n % 6 else _exclusive(rules.conn))
        rules.conn.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(len(groups))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    results = [outcomes.get_nowait() for _ in groups]
    assert all(r is None or isinstance(r, Conflict) or hasattr(r, "cards") for r in results), results
    made = [r for r in results if hasattr(r, "cards")]
    cards = [card for booking in made for card in booking.cards]
    assert made and len(cards) == len(set(cards))
    conn = connect(pg)
    assert events.first_broken(conn) is None
    conn.close()


def _exclusive(conn) -> None:
    with write(conn):  # the store's lock, exclusive: e.g. a reassign
        conn.execute("SELECT count(*) FROM bookings")


def test_a_writer_waits_for_the_write_lock_then_says_so_in_one_line(pg, monkeypatch):
    holder = connect(pg)
    monkeypatch.setattr(pg_module, "LOCK_TIMEOUT_MS", 200)
    waiter = connect(pg)
    with write(holder):  # another host's service, in the middle of a write
        with pytest.raises(StoreError) as locked:
            with write(waiter):
                waiter.execute("SELECT 1")
    pid = holder.execute("SELECT pg_backend_pid()").fetchone()[0]
    assert str(locked.value) == (f"the board database stayed locked for 0.2 s: role postgres (board gpu1, pid {pid})"
                                 " holds the lock it needs; nothing was changed: try again; a superuser may end that"
                                 f" session: SELECT pg_terminate_backend({pid})")
    with write(waiter):  # and once it is free, it is the waiter's
        waiter.execute("SELECT 1")
    holder.close()
    waiter.close()


@pytest.mark.postgresql
def test_a_lost_database_is_one_line_and_the_connection_comes_back():
    if reason := missing_reason():
        pytest.skip(reason)
    cluster = Cluster()  # its own: this test stops it
    try:
        store = PostgresStore(cluster.fresh_database(), host="gpu1")
        conn = connect(store)
        cluster.pause()
        with pytest.raises(StoreUnreachable) as lost:
            with write(conn):
                conn.execute("SELECT 1")
        assert str(lost.value).startswith("the board database is unreachable (gpu1 → ")
        cluster.resume()
        answers_again(conn)
        conn.close()
    finally:
        cluster.stop()


@pytest.mark.postgresql
def test_a_database_stopping_or_starting_is_unreachable_not_a_refusal_to_fix():
    """While the server stops (or starts) it answers a new connection 'FATAL: the database system is shutting down':
    the database going away, in the unreachable line, not 'refused ...; check [storage] url and the role's access'."""
    import psycopg

    if reason := missing_reason():
        pytest.skip(reason)
    cluster = Cluster()  # its own: this test stops it
    try:
        url = cluster.fresh_database()
        holder = psycopg.connect(url)  # the smart shutdown waits for it: the server stays 'shutting down'
        cluster.stopping()
        deadline = time.monotonic() + 60
        while True:  # until the server has the signal (pg_ctl returns once it is sent)
            try:
                PgConnection(PostgresStore(url, host="gpu1")).close()
            except BoardError as error:
                said = error
                break
            assert time.monotonic() < deadline, "the server never began to shut down"
        assert isinstance(said, StoreUnreachable), said
        assert str(said) == (f"the board database is unreachable (gpu1 → {cluster.sockets}:5432: the database system is"
                             " shutting down); nothing was changed")
        cluster.pause()  # ends the shutdown (fast), holder and all
        holder.close()
    finally:
        cluster.stop()


@pytest.mark.postgresql
def test_a_full_database_is_unreachable_for_now_and_retried_not_a_refusal_to_fix(tmp_path):
    """A server with no connection slot left turns a new connection away (SQLSTATE 53300: 'sorry, too many clients
    already', or 'remaining connection slots are reserved ...' for a role that is not a superuser): the database away
    for now, in the unreachable line with what it said, exit 1 for a write; the connection is tried again after its
    backoff and works once a slot is free."""
    import psycopg

    if reason := missing_reason():
        pytest.skip(reason)
    cluster = Cluster(max_connections=5)  # two slots for roles that are not superusers, three kept for superusers
    held: list = []
    try:
        url = cluster.fresh_database()
        where = f"{cluster.sockets}:5432"
        cluster.admin("CREATE ROLE board_gpu1 LOGIN")
        conn = PgConnection(PostgresStore(url, host="gpu1"))  # the service's connection (a superuser's, here)
        held.append(psycopg.connect(url, autocommit=True))
        with pytest.raises(StoreUnreachable) as reserved:  # both ordinary slots taken
            PgConnection(PostgresStore(url.replace("user=postgres", "user=board_gpu1"), host="gpu1"))
        said = str(reserved.value)
        assert said.startswith(f"the board database is unreachable (gpu1 → {where}: remaining connection slots are"
                               " reserved for ") and said.endswith("); nothing was changed") and "\n" not in said
        # the service's connection drops (its backend ended) while every slot is taken: it cannot come back yet
        held[0].execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'board gpu1'")
        deadline = time.monotonic() + 30  # pg_terminate_backend only signals: the slot is free once the backend exits
        while held[0].execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'board gpu1'"
                              ).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        held += [psycopg.connect(url, autocommit=True) for _ in range(4)]
        full = f"the board database is unreachable (gpu1 → {where}: sorry, too many clients already); nothing was changed"
        with pytest.raises(StoreUnreachable):
            conn.execute("SELECT 1")  # the broken connection: found on its use
        with pytest.raises(StoreUnreachable, match="^" + re.escape(full) + "$"):
            conn.execute("SELECT 1")  # opened again: turned away
        with pytest.raises(StoreUnreachable, match="^" + re.escape(full) + "$"):
            conn.execute("SELECT 1")  # within the backoff: not tried, the same line
        config = tmp_path / "board.toml"
        config.write_text('[fleet]\nhost = "gpu1"\n')
        booked = run_board("book", "--cards", "0", "--for", "1h",
                           env={"BOARD_CONFIG": str(config), "BOARD_DB_URL": url, "BOARD_DB": str(tmp_path / "board.db"),
                                "BOARD_SIMULATE": "1", "HOME": str(tmp_path)})
        assert (booked.returncode, booked.stdout, booked.stderr) == (1, "", f"board: {full}\n")
        for other in held:
            other.close()
        answers_again(conn)
        conn.close()
    finally:
        for other in held:
            other.close()
        cluster.stop()


# -- the change feed (milestone 2) ------------------------------------------------------------------------------


def test_a_booking_made_by_one_service_reaches_a_subscriber_of_another(pg):
    config = Config(db_path=Config().db_path, storage_url=pg.url)
    me = current_identity(config.admin_group)
    one = LocalClient.on(config, open_source(True), me)
    other = LocalClient.on(config, open_source(True), me)  # another host's service on the same database
    events: queue.Queue = queue.Queue()
    started = threading.Event()

    def read():
        for event in other.subscribe(("bookings",)):
            started.set()  # the listener's first look says 'bookings' changed: it is listening
            events.put(event)

    threading.Thread(target=read, daemon=True).start()
    assert started.wait(30)
    # Listening, it has compared this host's clock with the database's (for board doctor): the same machine here.
    assert other.service.clock_offset is not None and abs(other.service.clock_offset) < 5
    while not events.empty():
        events.get()
    start = (int(time.time()) // 3600 + 24) * 3600
    made = one.call("book", cards=[3], start=start, end=start + 3600)
    event = events.get(timeout=30)  # waits for the NOTIFY; the poll it replaced would have taken a second or more
    assert event["event"] == "bookings" and "version" in event, event  # a change, not an error
    assert [b["id"] for b in other.call("list", mine=True)["bookings"]] == [made["id"]]
    one.close()
    other.close()


def test_the_heartbeat_reads_the_bookings_again_only_when_the_audit_chain_moved(pg):
    """The agent keeps the live bookings for while the database is away (app.service.fleet.lastknown): a beat with nothing
    audited since keeps what it read, as of now; a booking moves the chain's tail, and the next beat reads it."""
    from app.service.fleet.lastknown import remember

    config = Config(db_path=Config().db_path, storage_url=pg.url)
    client = LocalClient.on(config, open_source(True), current_identity(config.admin_group))
    service = client.service
    start = (int(time.time()) // 3600 + 24) * 3600
    made = [client.call("book", cards=[3], start=start, end=start + 3600)]
    remember(service)
    first = service.known
    remember(service)
    second = service.known
    assert second.live is first.live and second.tail == first.tail and second.read_at >= first.read_at
    made.append(client.call("book", cards=[4], start=start, end=start + 3600))
    remember(service)
    third = service.known
    assert third.tail > second.tail and sorted(b.id for b in third.live) == [m["id"] for m in made]
    service.close()


def test_a_writes_locks_come_in_one_order_whatever_the_order_named_and_the_process():
    """Two hosts' services (two processes, each with its own salted hash()) booking the same cards named in any order
    take their locks in one order: the keys sorted. Else each could hold one card and wait for the other's.

    Wrong versions it fails on: the keys in the order the cards were named; the UUIDs deduplicated through a set (its
    order differs from process to process); the cards sorted by UUID, or their keys as text, not by key."""
    cards = [f"GPU-5090sim-0000-0000-0000-00000000000{n}" for n in range(8)]
    expected = lock_keys(cards, "alice")
    keys = [key for _, key in expected[:-1]]
    assert len(keys) == 8 and keys == sorted(keys) and expected[-1][0] == pg_module.USER_LOCK
    for named in (cards[::-1], cards[3:] + cards[:3], cards + cards[:2]):
        assert lock_keys(named, "alice") == expected
    script = ("import json, sys; from app.store.pg import lock_keys;"
              " print(json.dumps(lock_keys(json.loads(sys.argv[1]), 'alice')))")
    for seed in range(6):
        said = subprocess.run([sys.executable, "-c", script, json.dumps(cards[::-1])], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}, check=True)
        assert [tuple(lock) for lock in json.loads(said.stdout)] == expected, seed


def _card_locks(watcher, pid: int) -> set[tuple[str, int]]:
    """The cards' advisory locks of the session `pid`: ('holds' or 'waits', key)."""
    rows = watcher.execute("SELECT l.objid::int8, l.granted FROM pg_locks AS l WHERE l.locktype = 'advisory'"
                           " AND l.objsubid = 2 AND l.classid::int8 = ? AND l.pid = ?",
                           (pg_module.CARD_LOCK, pid)).fetchall()
    return {("holds" if granted else "waits", key - 2**32 if key >= 2**31 else key) for key, granted in rows}


def _waiting(watcher, pid: int, thread: threading.Thread) -> set[tuple[str, int]]:
    """The session's card locks once it waits for one (polled; at most 60 s, or until its thread ends)."""
    deadline = time.monotonic() + 60
    while thread.is_alive() and time.monotonic() < deadline:
        locks = _card_locks(watcher, pid)
        if any(state == "waits" for state, _ in locks):
            return locks
        time.sleep(0.01)
    return _card_locks(watcher, pid)


@pytest.mark.parametrize("pair", [(2, 7), (7, 2), (0, 5)], ids=["2 then 7", "7 then 2", "0 then 5"])
def test_two_writers_naming_the_same_cards_in_opposite_orders_wait_in_one_order_and_both_book(pg, fleet, pair):
    """Alice books two cards named one way, Bob the same two named the other way (at the next hour: both may book).
    Another session holds the lock of the card that comes first in the lock order, so each writer stops at its
    first card lock: there each must hold none of the other card's (pg_locks says), else the two would hold one card
    each and wait for the other's. Let go, both book: no deadlock, no booking lost, one audit chain.

    Wrong versions it fails on: the cards locked in the order named; in the reverse of the key order; the user's
    lock before the cards'."""
    uuids = {card.index: card.uuid for card in fleet.cards}
    first, second = sorted(pair, key=lambda index: pg_module._key(uuids[index]))
    first_key = pg_module._key(uuids[first])
    blocker, watcher = connect(pg), connect(pg)
    blocker.execute(f"SELECT pg_advisory_lock({pg_module.CARD_LOCK}, {first_key})")  # held by the session
    outcomes: dict[str, queue.Queue] = {"alice": queue.Queue(), "bob": queue.Queue()}
    writers = []
    for name, uid, cards, hour in (("alice", 1001, list(pair), 1), ("bob", 1002, list(pair[::-1]), 2)):
        rules = _rules(pg, fleet, name, uid)
        pid = rules.conn.execute("SELECT pg_backend_pid()").fetchone()[0]

        def run(rules=rules, cards=cards, hour=hour, name=name) -> None:
            try:
                outcomes[name].put(rules.create(cards=cards, start=FROZEN_NOW + hour * 3600,
                                                end=FROZEN_NOW + (hour + 1) * 3600))
            except Exception as error:  # noqa: BLE001 - the test looks at it
                outcomes[name].put(error)

        thread = threading.Thread(target=run)
        thread.start()
        assert _waiting(watcher, pid, thread) == {("waits", first_key)}, f"{name} named {cards}: {outcomes[name].queue}"
        writers.append((rules, thread))
    blocker.execute(f"SELECT pg_advisory_unlock({pg_module.CARD_LOCK}, {first_key})")
    for _, thread in writers:
        thread.join(60)
    made = {name: outcome.get_nowait() for name, outcome in outcomes.items()}
    assert {name: getattr(b, "cards", b) for name, b in made.items()} == {"alice": tuple(sorted(pair)),
                                                                         "bob": tuple(sorted(pair))}
    assert (made["alice"].start, made["bob"].start) == (FROZEN_NOW + 3600, FROZEN_NOW + 7200)
    assert events.first_broken(watcher) is None
    assert watcher.execute("SELECT actor, ok FROM events ORDER BY id").fetchall() == [("alice", 1), ("bob", 1)]
    for conn in (blocker, watcher, *(rules.conn for rules, _ in writers)):
        conn.close()


def test_a_writer_on_cards_waits_for_the_stores_lock_before_it_takes_any_cards_lock(pg, fleet):
    """A write on no named cards (the store's lock, exclusive: a reassign) is open; Alice's booking of cards 5 and 2
    waits for the store's lock first, holding none of its cards' locks meanwhile (a writer on those cards alone is
    not held up behind her), then books once that write commits.

    Wrong versions it fails on: the cards' locks taken before the store's; the store's lock not taken at all."""
    admin, watcher = connect(pg), connect(pg)
    rules = _rules(pg, fleet, "alice", 1001)
    pid = rules.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    outcome: queue.Queue = queue.Queue()
    with write(admin):
        thread = threading.Thread(target=lambda: outcome.put(_book(rules, [5, 2])))
        thread.start()
        assert _waits_for_a_lock(watcher, thread), f"Alice's booking did not wait for the store's lock: {outcome.queue}"
        waits = watcher.execute("SELECT l.objsubid FROM pg_locks AS l WHERE l.locktype = 'advisory' AND NOT l.granted"
                                " AND l.pid = ?", (pid,)).fetchall()
        assert (waits, _card_locks(watcher, pid)) == ([(1,)], set())  # one-key: the store's lock; no card's
    thread.join(60)
    assert outcome.get_nowait().cards == (2, 5)
    for conn in (admin, watcher, rules.conn):
        conn.close()


def test_the_clock_offset_is_read_against_the_middle_of_the_round_trip(monkeypatch):
    """board doctor's clock check: this host's clock at the middle of the query's round trip, minus the database's.
    Wrong versions: the offset read against the time before or after the round trip (off by half of it); the sign
    reversed."""
    import types

    class Answer:
        def execute(self, sql):
            return types.SimpleNamespace(fetchone=lambda: (101.0,))

    monkeypatch.setattr(pg_module, "time", types.SimpleNamespace(time=iter([100.0, 104.0]).__next__))
    assert clock_offset(Answer()) == 1.0

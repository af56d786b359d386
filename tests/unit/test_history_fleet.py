"""The fleet's rollups pushed from a host's history file to the store (app.history.fleet), in process: a real
history file, and a real SQLite file holding the store's `rollups` and `rollup_squats` tables as app.store.pg_schema
creates them on PostgreSQL (the module's SQL is the same on both: `?` parameters, BEGIN/COMMIT, ON CONFLICT DO
NOTHING). The PostgreSQL tier runs the same pusher against a real database (tests/integration/test_fleet_rollups.py)."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from app.core.cardstate import IN_USE, SQUATTED
from app.history.fleet import PUSH_BUCKETS, RETRY_S, Pusher, prune, push, push_batch, store_mark
from app.history.store import BUCKET_S, HistoryStore, Sample
from app.store.pg_schema import _V_FLEET_ROLLUPS

T0 = 1_795_965_900  # a bucket's start
A, B = "GPU-aaaa", "GPU-bbbb"
DAY = 86400


@pytest.fixture
def history(tmp_path):
    found = HistoryStore(tmp_path / "gpu1.history.db")
    yield found
    found.close()


def open_store(path) -> sqlite3.Connection:
    """The store's end of the push: its own connection, in autocommit (the module writes BEGIN and COMMIT itself)."""
    conn = sqlite3.connect(path, isolation_level=None)
    if conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'rollups'").fetchone()[0] == 0:
        conn.executescript(_V_FLEET_ROLLUPS)
    return conn


@pytest.fixture
def store(tmp_path):
    conn = open_store(tmp_path / "store.db")
    yield conn
    conn.close()


def fill(history: HistoryStore, buckets: int, start: int = T0, *, squatter: str | None = None) -> None:
    """A sample of cards A and B in each of `buckets` buckets from `start`, rolled up; `squatter` on A's in each."""
    samples = []
    for i in range(buckets):
        ts = start + i * BUCKET_S
        samples.append(Sample(ts=ts, uuid=A, state=SQUATTED if squatter else IN_USE, dt=10, util=i % 100, booking=1,
                              holder="alice", users=(("alice", 100),) + (((squatter, 50),) if squatter else ())))
        samples.append(Sample(ts=ts, uuid=B, state=IN_USE, dt=10, util=7))
    history.add(samples)
    history.roll_up(start + buckets * BUCKET_S)


def buckets_of(store: sqlite3.Connection, host: str = "gpu1") -> list[int]:
    return [ts for (ts,) in store.execute("SELECT DISTINCT ts FROM rollups WHERE host = ? ORDER BY ts", [host])]


def squats_of(store: sqlite3.Connection, host: str = "gpu1") -> list[tuple]:
    return [tuple(r) for r in store.execute(
        'SELECT card_uuid, ts, "user", n FROM rollup_squats WHERE host = ? ORDER BY ts, card_uuid', [host])]


class TestPushBatch:
    def test_a_batch_writes_every_cards_rollups_and_squats_of_its_buckets_and_returns_its_last_bucket(
            self, history, store):
        """Fails on: the squats or the rollups not written (or without their host), the last bucket read from
        another column, a batch of the wrong buckets, or None returned for a batch that wrote."""
        fill(history, 3, squatter="mallory")
        assert store_mark(store, "gpu1") is None  # nothing pushed yet
        assert push_batch(history, store, "gpu1", None, buckets=2) == T0 + BUCKET_S
        assert [tuple(r) for r in store.execute(
            "SELECT host, card_uuid, ts, n, util_min FROM rollups ORDER BY ts, card_uuid")] == [
            ("gpu1", A, T0, 1, 0), ("gpu1", B, T0, 1, 7),
            ("gpu1", A, T0 + BUCKET_S, 1, 1), ("gpu1", B, T0 + BUCKET_S, 1, 7)]
        assert squats_of(store) == [(A, T0, "mallory", 1), (A, T0 + BUCKET_S, "mallory", 1)]
        assert store_mark(store, "gpu1") == T0 + BUCKET_S
        assert store_mark(store, "gpu2") is None  # the mark is per host
        # the next batch from that mark: the third bucket alone, then nothing
        assert push_batch(history, store, "gpu1", T0 + BUCKET_S, buckets=2) == T0 + 2 * BUCKET_S
        assert buckets_of(store) == [T0, T0 + BUCKET_S, T0 + 2 * BUCKET_S]
        assert push_batch(history, store, "gpu1", T0 + 2 * BUCKET_S) is None
        assert not store.in_transaction

    def test_a_batch_the_store_refuses_leaves_none_of_its_rows_and_says_why(self, history, store):
        """Fails on: the rollups kept without their squats (no ROLLBACK, or a ROLLBACK that is not SQL), or the
        database's own error replaced by another."""
        fill(history, 2, squatter="mallory")
        store.execute("CREATE TRIGGER refuse BEFORE INSERT ON rollup_squats BEGIN SELECT RAISE(ABORT, 'refused'); END")
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            push_batch(history, store, "gpu1", None)
        assert not store.in_transaction
        assert buckets_of(store) == [] and store_mark(store, "gpu1") is None
        store.execute("DROP TRIGGER refuse")
        assert push_batch(history, store, "gpu1", None) == T0 + BUCKET_S  # the next try writes the batch whole


class TestPush:
    def test_push_catches_up_a_batch_per_transaction_from_the_stores_mark(self, history, store):
        """Fails on: a count of batches off by one or stuck at one, a push that starts from the first bucket again
        rather than the store's mark (or never stops), or one that ignores the host."""
        total = 2 * PUSH_BUCKETS + 1  # three batches: a day, a day and one bucket
        fill(history, total)
        assert push(history, store, "gpu1") == 3
        assert buckets_of(store) == [T0 + i * BUCKET_S for i in range(total)]
        assert push(history, store, "gpu1") == 0  # level: nothing read again
        assert push(history, store, "gpu2") == 3  # another host's mark is its own
        fill(history, 1, start=T0 + total * BUCKET_S)  # one more bucket rolled up
        assert push(history, store, "gpu1") == 1
        assert store_mark(store, "gpu1") == T0 + total * BUCKET_S

    def test_batches_limits_the_transactions_and_after_sets_where_to_start(self, history, store):
        """Fails on: `batches` taken one too many or too few, counted down by two, or reset; `after` ignored for the
        store's mark, or the store's mark ignored without `after`."""
        fill(history, 2 * PUSH_BUCKETS + 1)
        assert push(history, store, "gpu1", batches=1) == 1
        assert store_mark(store, "gpu1") == T0 + (PUSH_BUCKETS - 1) * BUCKET_S
        assert push(history, store, "gpu1", batches=0) == 0
        assert push(history, store, "gpu1", batches=2) == 2
        assert store_mark(store, "gpu1") == T0 + 2 * PUSH_BUCKETS * BUCKET_S
        # `after`: from there, whatever the store holds (board migrate copies from the start of a host's file)
        assert push(history, store, "gpu2", after=T0 + (2 * PUSH_BUCKETS - 1) * BUCKET_S) == 1
        assert buckets_of(store, "gpu2") == [T0 + 2 * PUSH_BUCKETS * BUCKET_S]
        assert push(history, store, "gpu2", after=T0 + (2 * PUSH_BUCKETS - 1) * BUCKET_S, batches=1) == 1  # again
        assert buckets_of(store, "gpu2") == [T0 + 2 * PUSH_BUCKETS * BUCKET_S]  # ON CONFLICT: nothing twice


class TestPrune:
    def test_prune_deletes_a_hosts_rollups_and_squats_before_the_cut_and_keeps_the_rest(self, history, store):
        """Fails on: the squats kept, the bucket at the cut deleted, another host's rows deleted, or the count of
        rollup rows deleted not returned."""
        fill(history, 3, squatter="mallory")
        push(history, store, "gpu1")
        push(history, store, "gpu2")
        assert prune(store, "gpu1", T0 + BUCKET_S) == 2  # the first bucket's two cards
        assert buckets_of(store) == [T0 + BUCKET_S, T0 + 2 * BUCKET_S]
        assert squats_of(store) == [(A, T0 + BUCKET_S, "mallory", 1), (A, T0 + 2 * BUCKET_S, "mallory", 1)]
        assert buckets_of(store, "gpu2") == [T0, T0 + BUCKET_S, T0 + 2 * BUCKET_S]
        assert len(squats_of(store, "gpu2")) == 3
        assert prune(store, "gpu1", T0 + BUCKET_S) == 0
        assert not store.in_transaction

    def test_a_prune_the_store_refuses_deletes_nothing_and_says_why(self, history, store):
        """Fails on: the rollups deleted without their squats (no ROLLBACK, or one that is not SQL), or the
        database's error replaced by another."""
        fill(history, 2, squatter="mallory")
        push(history, store, "gpu1")
        store.execute("CREATE TRIGGER refuse BEFORE DELETE ON rollup_squats BEGIN SELECT RAISE(ABORT, 'refused'); END")
        with pytest.raises(sqlite3.IntegrityError, match="refused"):
            prune(store, "gpu1", T0 + 2 * BUCKET_S)
        assert not store.in_transaction
        assert buckets_of(store) == [T0, T0 + BUCKET_S] and len(squats_of(store)) == 2


class Waits(threading.Event):
    """The pusher's `wake` as the test sees it: each wait (the pause before the next try) is recorded and returns at
    once, as if the sampler had rolled up again; after `rounds` of them the service stops."""

    def __init__(self, stop: threading.Event, rounds: int) -> None:
        super().__init__()
        self.stop, self.rounds, self.timeouts = stop, rounds, []

    def wait(self, timeout=None) -> bool:
        self.timeouts.append(timeout)
        if len(self.timeouts) >= self.rounds:
            self.stop.set()
        return True


def pusher(history, path, *, now: float, fails: int = 0, log: list) -> tuple[Pusher, list]:
    """A pusher of host gpu1 on the store file `path`; its first `fails` connections fail as an unreachable
    database's do. Returns it and the connections it opened."""
    opened = []

    def connect():
        if len(opened) < fails:
            opened.append(None)
            raise sqlite3.OperationalError("unable to open database file")
        opened.append(open_store(path))
        return opened[-1]

    return Pusher(history, connect, "gpu1", rollup_days=1.0, clock=lambda: now, log=log.append), opened


class TestPusher:
    def test_its_loop_pushes_prunes_what_is_a_day_old_waits_and_closes_both_ends(self, history, tmp_path):
        """Fails on: a loop that never runs, a connection opened each step (or never), the cut a second off or
        the wrong way, a pause of other than RETRY_S, a word logged while all goes well, either end left open."""
        start = T0 - 10 * BUCKET_S
        fill(history, 12, start=start)  # 12 buckets, up to T0 + BUCKET_S
        log: list[str] = []
        now = T0 + DAY + 1  # the cut, a day before now, is one second past bucket T0's start
        found, opened = pusher(history, tmp_path / "store.db", now=now, log=log)
        found.wake.set()  # what the sampler does after each roll-up
        assert found.wake.is_set()
        stop = threading.Event()
        found.wake = Waits(stop, rounds=2)
        reading = history.conn  # the history file's connection on this thread, the pusher's
        found.run(stop)
        assert log == [] and found.wake.timeouts == [RETRY_S, RETRY_S]
        assert len(opened) == 1  # one connection, kept between steps
        with pytest.raises(sqlite3.ProgrammingError):
            opened[0].execute("SELECT 1")  # closed at the end
        with pytest.raises(sqlite3.ProgrammingError):
            reading.execute("SELECT 1")
        with open_store(tmp_path / "store.db") as store:
            assert buckets_of(store) == [T0 + BUCKET_S]  # pushed, then all but the bucket after the cut pruned

    def test_a_step_pushes_what_is_new_and_returns_the_batches_written(self, history, tmp_path):
        """Fails on: the count of batches lost, the push's or the prune's arguments mixed up."""
        fill(history, 2)
        found, opened = pusher(history, tmp_path / "store.db", now=T0 + 3 * BUCKET_S, log=[])
        assert found.step() == 1
        assert found.step() == 0
        assert len(opened) == 1
        assert buckets_of(opened[0]) == [T0, T0 + BUCKET_S]
        opened[0].close()

    def test_an_unreachable_store_is_said_once_and_its_return_once(self, history, tmp_path):
        """Fails on: the failure said at every try, only from the second (or not at all, or without the error), the
        return not said, or said again while all goes well."""
        fill(history, 2)
        log: list[str] = []
        found, opened = pusher(history, tmp_path / "store.db", now=T0 + 3 * BUCKET_S, fails=3, log=log)
        stop = threading.Event()
        found.wake = Waits(stop, rounds=5)
        found.run(stop)
        assert log == ["history: rollups not written to the store yet: OperationalError: unable to open database file",
                       "history: rollups written to the store again"]
        assert len(opened) == 4
        with open_store(tmp_path / "store.db") as store:
            assert buckets_of(store) == [T0, T0 + BUCKET_S]

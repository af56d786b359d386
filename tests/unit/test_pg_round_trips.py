"""A booking on PostgreSQL, counted in round trips to the database (issue 37: a network between the service and the
database makes each one cost): counted twice, by the connection itself (PgConnection.round_trips) and on the wire, by
a proxy between the two that counts each time the service speaks again after the database answered.

And the audit chain's hash, which the database makes for an event appended that way (app.store.events.APPEND_PG),
agrees with the one Python makes (app.store.events._digest), which board doctor checks the chain with.
"""

from __future__ import annotations

import random
import socket
import threading
import time

import pytest

from app.client.local import LocalClient
from app.config import Config, FleetSettings
from app.core.identity import current_identity
from app.errors import Conflict
from app.gpu import open_source
from app.store import events
from app.store.db import connect, write

pytestmark = pytest.mark.postgresql
HOUR = 3600


class TurnCounter:
    """127.0.0.1:port -> the cluster's Unix socket. `turns`: how often the client sent after the server had answered
    (or first): the round trips it waited for."""

    def __init__(self, unix_path: str) -> None:
        self.unix_path, self.turns, self._last = unix_path, 0, "server"
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(self.unix_path)
            threading.Thread(target=self._pipe, args=(client, upstream, "client"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, "server"), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, side: str) -> None:
        while data := source.recv(65536):
            with self._lock:  # counted before it is passed on: an answer is counted before the next question
                if side == "client" and self._last == "server":
                    self.turns += 1
                self._last = side
            sink.sendall(data)
        sink.close()

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def counted(pg_cluster):
    """A service's rules (LocalClient) on gpu1's simulated cards, through a TurnCounter; (client, proxy)."""
    url = pg_cluster.fresh_database()
    proxy = TurnCounter(str(pg_cluster.sockets / ".s.PGSQL.5432"))
    through = url.replace(f"host={pg_cluster.sockets}", f"host=127.0.0.1&port={proxy.port}")
    me = current_identity(Config().admin_group)
    client = LocalClient.on(Config(storage_url=through, fleet=FleetSettings(host="gpu1")),
                            open_source(True, host="gpu1"), me)
    yield client, proxy
    client.close()
    proxy.close()


def trips(client, proxy, call) -> tuple[int, int]:
    """(round trips on the wire, as the connection counted them) that `call` made."""
    conn = client.service.conn
    wire, counted = proxy.turns, conn.round_trips
    call()
    return proxy.turns - wire, conn.round_trips - counted


def test_a_booking_on_named_cards_is_two_round_trips(counted):
    """1: BEGIN + the locks + the savepoint + the new booking's id + the live bookings on its cards or of its user
    (app.store.bookings.Prefetched), which the rules read; 2: the booking + its cards + its read-back + the chain's
    lock + its event + the COMMIT (PgConnection.defer). The cards' rows are not read again while they stand as last
    read.

    Wrong versions it fails on: the cards read at each booking (3); the booking read back after the COMMIT (3); the
    insert or the event sent on their own (3 or more); a rule's read not answered by the prefetch (the cards' live
    bookings, the user's, the on-demand ones it would cut: 3 or more); a counter that misses a pipelined round trip
    (the wire says more than the connection)."""
    client, proxy = counted
    start = (int(time.time()) // 3600 + 24) * 3600
    client.call("book", cards=[0], start=start, end=start + 3600)  # the first writes the cards' rows
    made = {}
    wire, said = trips(client, proxy, lambda: made.update(client.call("book", cards=[1], start=start, end=start + 3600)))
    assert (wire, said) == (2, 2)
    assert (made["cards"], made["start"], made["end"]) == ([1], start, start + 3600)  # read back with the insert
    conn = client.service.conn
    assert events.first_broken(conn) is None  # the chain the database hashed verifies in Python
    (booking,) = conn.execute("SELECT booking_id FROM events WHERE action = 'create' ORDER BY id DESC LIMIT 1").fetchone()
    assert booking == made["id"]


def test_a_refused_booking_rolls_back_what_was_deferred_and_its_refusal_is_audited(pg_cluster):
    """A clash with bob's booking is refused by the rules (from what was read with the locks), in its words; the
    refusal's event still goes with the COMMIT, and the chain verifies. Wrong versions: the cards' bookings left out
    of that read (the database's overlap error instead of the rules' words), the refusal's event dropped with the
    deferred statements."""
    from app.core.identity import Identity

    url = pg_cluster.fresh_database()
    config = Config(storage_url=url, fleet=FleetSettings(host="gpu1"))
    bob = LocalClient.on(config, open_source(True, host="gpu1"), Identity("bob", 1002, False))
    client = LocalClient.on(config, open_source(True, host="gpu1"), current_identity(Config().admin_group))
    start = (int(time.time()) // 3600 + 24) * 3600
    first = bob.call("book", cards=[2], start=start, end=start + 3600)
    with pytest.raises(Conflict, match="card 2 is booked by bob"):
        client.call("book", cards=[2], start=start, end=start + 3600)
    bob.close()
    conn = client.service.conn
    live = conn.execute("SELECT count(*) FROM bookings WHERE status = 'booked'").fetchone()[0]
    assert live == 1
    refused = conn.execute("SELECT ok, booking_id FROM events WHERE action = 'create' ORDER BY id").fetchall()
    assert refused == [(1, first["id"]), (0, None)]
    assert events.first_broken(conn) is None
    client.close()


def test_an_overlap_the_database_refuses_at_the_commit_is_a_conflict_and_nothing_stays(pg_cluster):
    """The insert goes with the COMMIT: the EXCLUDE's refusal arrives there, and is still the race's Conflict, with
    the transaction rolled back and nothing kept for the next write. Wrong version: the error passed through raw."""
    from app.store import bookings as rows

    url = pg_cluster.fresh_database()
    me = current_identity(Config().admin_group)
    client = LocalClient.on(Config(storage_url=url, fleet=FleetSettings(host="gpu1")), open_source(True, host="gpu1"), me)
    start = (int(time.time()) // 3600 + 24) * 3600
    client.call("book", cards=[3], start=start, end=start + 3600)
    conn = client.service.conn
    real = rows.first_conflict

    def blind(*args, **kwargs):  # the rules miss the clash, as a writer that raced past them would
        return None

    rows.first_conflict = blind
    try:
        with pytest.raises(Conflict, match="just booked by someone else"):
            client.call("book", cards=[3], start=start, end=start + 3600)
    finally:
        rows.first_conflict = real
    assert not conn.in_transaction and conn.made == {} and conn._deferred == []
    assert conn.execute("SELECT count(*) FROM bookings").fetchone()[0] == 1
    client.close()


ALPHABET = "aé\"\\\n\t\x01\x1f\u2028\U0001f600 {}[],:"


def _text(rng: random.Random, most: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, most)))


def test_the_databases_hash_of_an_event_is_pythons_on_generated_events(pg_cluster):
    """Generated events (text with quotes, backslashes, control characters, non-ASCII; ids or none; ok or not; a
    tail that is not hex, as a hand edit could leave) appended by the database's statement hash as _digest does.
    Wrong versions: separators other than json.dumps's, to_json dropped for the tail (a quote in it), ok as a bool,
    the fields' JSON escaping ASCII on one side only."""
    conn = connect(Config(storage_url=pg_cluster.fresh_database()).store)
    rng = random.Random(37)
    for n in range(200):
        prev = rng.choice([events.GENESIS, "%064x" % rng.getrandbits(256), _text(rng, 12)])
        fields = (rng.randint(0, 2**40), rng.randint(0, 2**31), _text(rng, 10), _text(rng, 8),
                  rng.choice([None, rng.randint(1, 10**6)]), rng.random() < 0.5, _text(rng, 30))
        with write(conn):
            conn.execute("INSERT INTO events (ts, uid, actor, action, ok, details, prev_hash, hash)"
                         " VALUES (0, 0, 'seed', 'seed', 1, '{}', '', ?)", (prev,))
            events._append_pg(conn, fields)
        (stored_prev, stored) = conn.execute("SELECT prev_hash, hash FROM events ORDER BY id DESC LIMIT 1").fetchone()
        assert stored_prev == prev
        assert stored == events._digest(prev, *fields), (n, prev, fields)
    conn.close()


UUIDS = [f"GPU-{n:04x}" for n in range(4)]


def _prefetch_answers(conn, rng: random.Random, uuids: list[str], user: str, since: int, ids: list[int]) -> list:
    """What the rules ask within a write on `uuids` by `user`: the cards' bookings (all, on demand, not), the first
    conflict, the user's, each booking by id; in spans within what Prefetched covers and past it."""
    from app.store import bookings as rows

    asked = []
    for _ in range(6):
        start = since + rng.randint(-2, 30) * HOUR // 2
        end = start + rng.randint(1, 12) * HOUR // 2
        among = rng.choice([uuids, UUIDS])  # the write's cards, and others (which SQL answers)
        cards = rng.sample(among, rng.randint(1, len(among)))
        excluding = rng.choice([None, *ids])
        for on_demand in (None, True, False):
            asked.append(rows.overlapping(conn, cards, start, end, excluding, on_demand=on_demand))
            asked.append(rows.live_between(conn, start, end, user=user, on_demand=on_demand))
        asked.append(rows.first_conflict(conn, cards, start, end, excluding))
    asked.append([rows.get(conn, i) for i in ids])
    return asked


def test_the_prefetched_bookings_answer_as_the_sql_does_on_generated_calendars(pg_cluster):
    """Generated calendars (bookings on one to three of four cards, by three users, some on demand, some cancelled,
    some ended): inside a write on some of the cards by one user, every question the rules ask of those cards and that
    user is answered from what was read with the locks (app.store.bookings.Prefetched) as SQL answers it, before and
    after a change in the write, and where no on-demand booking reaches past its cards, in fewer round trips than SQL.
    Wrong versions: a booking of the user's on other cards left out of the read, the span's start compared with the
    bookings' starts instead of their ends, a question past the span or about other cards answered from the read, a
    change not read again. (An on-demand
    booking that another writer cuts meanwhile: tests/unit/test_on_demand_bookings.py, on PostgreSQL.)"""
    from app.gpu.model import CardReading
    from app.store import bookings as rows
    from app.store.bookings import Prefetched

    conn = connect(Config(storage_url=pg_cluster.fresh_database()).store)
    now = (int(time.time()) // HOUR) * HOUR
    rng = random.Random(37)
    with write(conn):
        rows.sync_cards(conn, [CardReading(index=i, uuid=u, name="H100") for i, u in enumerate(UUIDS)], now)
    for case in range(8):
        ids = []
        base = now + case * 100 * HOUR
        uuids, writer = rng.sample(UUIDS, rng.randint(1, 2)), rng.choice(["alice", "bob"])
        for k in range(rng.randint(6, 14)):
            cards = rng.sample(UUIDS, rng.randint(1, 3))
            start = base + rng.randint(-20, 40) * HOUR // 2
            user = rng.choice(["alice", "bob", "board-llama"] if case % 2 else ["alice", "bob"])  # on demand or not
            if k == 0:  # one of the writer's on other cards, which it must see too
                cards, start, user = [u for u in UUIDS if u not in uuids][:1], base + HOUR, writer
            try:
                with write(conn):
                    made = rows.insert(conn, user=user, uid=1000, uuids=cards, start=start,
                                       end=start + rng.randint(1, 10) * HOUR // 2, klass="experiment", note="",
                                       request={"on_demand": "m"} if user == "board-llama" else None, now=now,
                                       created_by=1000)
                    if rng.random() < 0.2:
                        rows.set_cancelled(conn, made)
                ids.append(made)
            except Exception:  # noqa: BLE001 - an overlap the database refuses: a calendar without it
                pass
        user, since = writer, base
        with write(conn, cards=uuids, user=user, reads=(since, since + 12 * HOUR)):
            assert isinstance(conn.calendar, Prefetched)
            seed = rng.random()
            trips = conn.round_trips
            prefetched = _prefetch_answers(conn, random.Random(seed), uuids, user, since, ids)
            trips = conn.round_trips - trips
            kept, conn.calendar = conn.calendar, None
            sql = conn.round_trips
            assert prefetched == _prefetch_answers(conn, random.Random(seed), uuids, user, since, ids), case
            if not conn.calendar and not kept.unsure:  # no on-demand booking that others may cut: it answered
                assert trips < conn.round_trips - sql, case
            conn.calendar = kept
            mine = [b for b in rows.live_between(conn, since, since + 10**6, user=user)]
            if mine:  # a change in the write: read again
                rows.set_times(conn, mine[0].id, mine[0].start, mine[0].end + 1)
                prefetched = _prefetch_answers(conn, random.Random(seed), uuids, user, since, ids)
                kept, conn.calendar = conn.calendar, None
                assert prefetched == _prefetch_answers(conn, random.Random(seed), uuids, user, since, ids), case
                conn.calendar = kept
        assert conn.calendar is None  # gone with the locks
    conn.close()

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
from app.gpu import open_source
from app.store import events
from app.store.db import connect, write

pytestmark = pytest.mark.postgresql


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


def test_a_booking_on_named_cards_is_five_round_trips(counted):
    """BEGIN + the locks + the savepoint + the new booking's id; the cards' live bookings; the user's (the limits);
    the cards' on-demand bookings (which it would cut); the booking + its cards + the chain's lock + its event + the
    COMMIT, with the booking read back. The cards' rows are not read again while they stand as last read.

    Wrong versions it fails on: the cards read at each booking (6); the booking read back after the COMMIT (6); the
    insert or the event sent on their own (6 or more); a counter that misses a pipelined round trip (the wire says
    more than the connection)."""
    client, proxy = counted
    start = (int(time.time()) // 3600 + 24) * 3600
    client.call("book", cards=[0], start=start, end=start + 3600)  # the first writes the cards' rows
    made = {}
    wire, said = trips(client, proxy, lambda: made.update(client.call("book", cards=[1], start=start, end=start + 3600)))
    assert (wire, said) == (5, 5)
    assert (made["cards"], made["start"], made["end"]) == ([1], start, start + 3600)  # read back with the insert
    conn = client.service.conn
    assert events.first_broken(conn) is None  # the chain the database hashed verifies in Python
    (booking,) = conn.execute("SELECT booking_id FROM events WHERE action = 'create' ORDER BY id DESC LIMIT 1").fetchone()
    assert booking == made["id"]


def test_a_refused_booking_rolls_back_what_was_deferred_and_its_refusal_is_audited(counted):
    """A clash with another booking is refused by the rules; the refusal's event still goes with the COMMIT, and the
    next booking reads the cards' rows afresh only if they changed. Wrong versions: the deferred insert kept after a
    rollback (a second booking appears), the refusal's event dropped with the deferred statements."""
    client, proxy = counted
    start = (int(time.time()) // 3600 + 24) * 3600
    first = client.call("book", cards=[2], start=start, end=start + 3600)
    with pytest.raises(Exception, match="booked by"):
        client.call("book", cards=[2], start=start, end=start + 3600)
    conn = client.service.conn
    live = conn.execute("SELECT count(*) FROM bookings WHERE status = 'booked'").fetchone()[0]
    assert live == 1
    refused = conn.execute("SELECT ok, booking_id FROM events WHERE action = 'create' ORDER BY id").fetchall()
    assert refused == [(1, first["id"]), (0, None)]
    assert events.first_broken(conn) is None


def test_an_overlap_the_database_refuses_at_the_commit_is_a_conflict_and_nothing_stays(pg_cluster):
    """The insert goes with the COMMIT: the EXCLUDE's refusal arrives there, and is still the race's Conflict, with
    the transaction rolled back and nothing kept for the next write. Wrong version: the error passed through raw."""
    from app.errors import Conflict
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

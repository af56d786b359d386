"""What bench/bench_fleet.py found on PostgreSQL, kept: the work a booking or a change costs, not its time.

- The change feed's NOTIFY wakes the boards when another host writes (app.service.box.watch); the heartbeat does not
  wake them a second time (app.service.fleet.hosts.start_heartbeat), which would make every open board load its window
  twice for each booking made elsewhere (the benchmark counts the events per booking).
- A result's rows are read without psycopg building its column descriptions again for each row (app.store.pg.Cursor).
- A booking's round trips to the database are counted in tests/unit/test_pg_round_trips.py.
"""

from __future__ import annotations

import queue
import threading
import time

from app.client.local import LocalClient
from app.config import Config, FleetSettings
from app.core.identity import current_identity
from app.gpu import open_source
from app.service.fleet import hosts
from app.store.db import connect


def test_on_postgresql_the_heartbeat_leaves_another_hosts_booking_to_the_notify(pg_cluster, monkeypatch):
    monkeypatch.setattr(hosts, "BEAT_S", 0.05)
    url = pg_cluster.fresh_database()
    me = current_identity(Config().admin_group)
    made = {name: LocalClient.on(Config(storage_url=url, fleet=FleetSettings(host=name)),
                                 open_source(True, host=name), me) for name in ("gpu1", "gpu2")}
    gpu1, gpu2 = made["gpu1"], made["gpu2"]
    subscriber = gpu1.service.hub.subscribe(("bookings",))  # the hub alone: no listener runs in this process
    beats: queue.Queue = queue.Queue()
    stopping = threading.Event()

    def run_db(fn):  # the agent's database thread; here the heartbeat's own, with gpu1's connection to itself
        result = fn()
        beats.put(result)
        return result

    thread = hosts.start_heartbeat(gpu1.service, run_db, stopping)
    beats.get(timeout=30)  # a beat before the booking
    start = (int(time.time()) // 3600 + 24) * 3600
    gpu2.call("book", cards=[2], start=start, end=start + 3600)
    for _ in range(2):  # and at least one whole beat after its commit
        beats.get(timeout=30)
    stopping.set()
    thread.join(30)
    assert subscriber.take(timeout=0) == []
    for client in made.values():
        client.close()


def test_rows_are_read_without_describing_the_result_again_for_each_row(pg_cluster, monkeypatch):
    import psycopg

    conn = connect(Config(storage_url=pg_cluster.fresh_database()).store)
    looks = []
    described = psycopg.Cursor.description

    def counted(cursor):
        looks.append(1)
        return described.fget(cursor)

    monkeypatch.setattr(psycopg.Cursor, "description", property(counted))
    rows = list(conn.execute("SELECT n FROM generate_series(1, 50) AS n"))
    assert [r[0] for r in rows] == list(range(1, 51))
    assert len(looks) <= 1  # once per result (it was once per row), each look a new column object per column
    assert conn.execute("SELECT 1 WHERE false").fetchone() is None
    assert conn.execute("SET TIME ZONE 'UTC'").fetchall() == []  # no rows to read
    conn.close()

"""On PostgreSQL other hosts' services write too: the agent LISTENs, and a booking another service commits reaches the
agent's subscribers at once (app.service.box.watch), over the socket as in process (tests/unit/test_pg_store.py)."""

from __future__ import annotations

import json
import queue
import threading
import time

from app.client.local import LocalClient
from app.config import Config
from app.core.identity import current_identity
from app.gpu import open_source


def test_a_booking_another_service_commits_reaches_the_agents_subscriber(make_agent, pg_cluster):
    url = pg_cluster.fresh_database()
    agent = make_agent(storage_url=url)
    subscriber = agent.client()
    # The subscription is in place once the service has replied to it (the first line); events follow.
    sock, reader, _ = subscriber.stream("subscribe", {"kinds": ["bookings"]})
    events: queue.Queue = queue.Queue()

    def read():
        while line := reader.readline():
            events.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    _wait_until_listening(url)
    while not events.empty():  # what the agent said when its listener connected
        events.get()
    other = LocalClient.on(Config(storage_url=url), open_source(True), current_identity("board-admin"))  # another host
    made = other.call("book", cards=[5], start=_tomorrow(), end=_tomorrow() + 3600)
    event = events.get(timeout=30)  # the NOTIFY wakes the agent's listener at once; no poll stands between
    assert event["event"] == "bookings" and "version" in event, event  # a change, not an error
    assert made["id"] in [b["id"] for b in subscriber.call("list")["bookings"]]
    other.close()
    sock.close()
    subscriber.close()


def _wait_until_listening(url: str) -> None:
    """Until the agent's listener has LISTENed and measured the clock (app.service.box.watch), which it does at once."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                               " AND query LIKE 'SELECT extract(epoch FROM clock_timestamp())%'").fetchone()[0]:
            assert time.monotonic() < deadline, "the agent never listened"
            time.sleep(0.05)


def _tomorrow() -> int:
    return (int(time.time()) // 3600 + 24) * 3600

"""Idle release in the real `board agent` (BOARD_SIMULATE), on its own clock, threads and socket: its sampler records
the idle cards, its enforcement loop tells the holder, then gives the booking back. The limits are seconds here;
tests/integration/test_idle_release.py pins the clock and checks each rule to the second."""

from __future__ import annotations

import json
import queue
import threading
import time

WAIT_S = 60  # a bound for a stuck agent, not a timing: each event is awaited as it comes


def test_the_agent_tells_the_holder_then_gives_the_idle_booking_back(make_agent):
    agent = make_agent(sections={
        "policy": {"idle_release_after_min": 0.1, "idle_release_notice_min": 0.05, "idle_release_grace_min": 0},
        "history": {"sample_s": 1}, "enforce": {"interval_s": 0.5}})
    client = agent.client()
    sock, reader, _ = client.stream("subscribe", {"kinds": ["notice"]})
    notices: queue.Queue = queue.Queue()

    def read():
        while line := reader.readline():
            event = json.loads(line)
            if event.get("event") == "notice" and "idle" in event["message"]:  # not "has started"
                notices.put(event["message"])

    threading.Thread(target=read, daemon=True).start()
    now = int(time.time())
    booking = client.call("book", cards=[3], start=now, end=now + 3600)["id"]  # the simulated card 3 runs nothing
    told = [notices.get(timeout=WAIT_S) for _ in range(2)]
    assert told[0].startswith(f"booking {booking} on card 3 is idle: released in 1 min unless used"), told
    assert told[1].startswith(f"booking {booking} on card 3 was released: idle for 0 min"), told
    after = client.call("get", id=booking)
    assert after["end"] <= int(time.time()) < now + 3600 and after["notice"].startswith("released: idle since")
    newest = client.call("log", booking=booking)[0]
    assert (newest["actor"], newest["action"], newest["ok"]) == ("board", "idle_release", True), newest
    sock.close()
    client.close()

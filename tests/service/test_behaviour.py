"""The same behaviour whichever transport: every test here runs in process and through the real socket.

The expectations are identical for both; the only field that may differ is whoami's transport
(and its database path, which the socket never shows).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import queue
import threading
import time

import pytest

from app.errors import BadInput, Conflict, NotPermitted

HOUR = 3600
# Who the caller is: root over the socket (the agent needs root to start); over the local transport,
# whoever runs the tests. The service must say exactly this, from the uid, never from $USER.
UID = os.getuid()
ME = pwd.getpwuid(UID).pw_name
ADMIN = UID == 0 or any(g.gr_name == "board-admin" and (g.gr_gid in os.getgroups() or ME in g.gr_mem)
                        for g in grp.getgrall())
BOOKING_KEYS = {"id", "user", "uid", "cards", "card_uuids", "host", "start", "end", "class", "note", "status", "request",
                "created_at", "requested_at", "queued", "series_id", "notice"}
CLI_BOOKING_KEYS = {"id", "user", "cards", "card_uuids", "host", "start", "end", "class", "note", "status",
                    "requested_at", "queued", "series_id", "notice"}


def tomorrow(hours: float = 0) -> int:
    """A whole hour about a day ahead (well inside max_ahead_days, clear of today's simulated squatters)."""
    return (int(time.time()) // HOUR + 24) * HOUR + int(hours * HOUR)


def events_of(client, booking_id=None, limit=1000) -> list[dict]:
    return client.call("log", limit=limit, **({} if booking_id is None else {"booking": booking_id}))


def everything(client) -> list[dict]:
    return client.call("list", include_cancelled=True, start=0)["bookings"]


def one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("board: "), stderr
    return lines[0]


# -- booking ------------------------------------------------------------------------------------


def test_book_by_count_picks_that_many_free_cards(client):
    start = tomorrow()
    booking = client.call("book", count=2, start=start, end=start + 2 * HOUR, note="eval run")
    assert set(booking) == BOOKING_KEYS
    assert len(booking["cards"]) == 2 and len(set(booking["card_uuids"])) == 2
    assert (booking["start"], booking["end"]) == (start, start + 2 * HOUR)
    assert (booking["user"], booking["uid"], booking["status"]) == (ME, UID, "booked")
    assert (booking["class"], booking["note"]) == ("experiment", "eval run")
    assert client.call("get", id=booking["id"]) == booking


def test_book_by_cards_takes_exactly_those(client):
    start = tomorrow()
    booking = client.call("book", cards=[5, 4], start=start, end=start + HOUR, **{"class": "batch"})
    assert sorted(booking["cards"]) == [4, 5] and booking["class"] == "batch"
    status = client.call("status")
    uuids = {c["index"]: c["uuid"] for c in status["cards"]}
    assert sorted(booking["card_uuids"]) == sorted([uuids[4], uuids[5]])


def test_a_conflict_is_refused_and_writes_only_its_audit_row(client):
    start = tomorrow()
    first = client.call("book", cards=[3], start=start, end=start + 2 * HOUR)
    bookings_before, events_before = everything(client), events_of(client)
    with pytest.raises(Conflict) as refused:
        client.call("book", cards=[2, 3], start=start + HOUR, end=start + 3 * HOUR)
    assert refused.value.exit_code == 3
    assert "next free start" in str(refused.value)
    assert everything(client) == bookings_before
    events_after = events_of(client)
    added = [e for e in events_after if e["id"] not in {e["id"] for e in events_before}]
    assert len(added) == 1 and len(events_after) == len(events_before) + 1
    assert (added[0]["action"], added[0]["ok"], added[0]["actor"]) == ("create", False, ME)
    assert "refused" in added[0]["details"]
    assert client.call("get", id=first["id"])["cards"] == [3]



def test_of_two_bookings_in_the_way_the_refusal_names_the_one_that_ends_first(client):
    """Card 4's booking was made first and starts first but ends last; card 5's starts an hour later and ends first:
    the refusal names card 5's, and the next free start is after both. Wrong versions: the first to start, or the
    first made (card 4's); the last to end."""
    start = tomorrow()
    first = client.call("book", cards=[4], start=start, end=start + 4 * HOUR)
    ends_first = client.call("book", cards=[5], start=start + HOUR, end=start + 2 * HOUR)
    with pytest.raises(Conflict) as refused:
        client.call("book", cards=[4, 5], start=start, end=start + 5 * HOUR)
    said = str(refused.value)
    assert said.startswith(f"card 5 is booked by {ME} from "), said
    assert f"(booking {ends_first['id']})" in said and f"(booking {first['id']})" not in said

def test_book_by_count_on_a_full_fleet_starts_when_asked_or_not_at_all(client):
    start = tomorrow()
    whole = client.call("book", count=8, start=start, end=start + HOUR)
    assert sorted(whole["cards"]) == list(range(8))
    with pytest.raises(Conflict) as refused:  # no silent slide
        client.call("book", count=1, start=start, end=start + HOUR)
    assert f"booked by {whole['user']} from" in str(refused.value) and "the earliest start that works" in str(refused.value)
    later = client.call("book", count=1, start=start, end=start + HOUR, or_later=True)
    assert (later["start"], later["end"], later["queued"]) == (start + HOUR, start + 2 * HOUR, "cards")
    with pytest.raises(Conflict):  # exact cards are not moved
        client.call("book", cards=[later["cards"][0]], start=start, end=start + HOUR)


# -- changing bookings --------------------------------------------------------------------------


def test_cancel_a_future_booking(client):
    start = tomorrow()
    booking = client.call("book", cards=[1], start=start, end=start + HOUR)
    cancelled = client.call("cancel", id=booking["id"])
    assert cancelled["status"] == "cancelled" and cancelled["id"] == booking["id"]
    assert [b["id"] for b in client.call("list")["bookings"]] == []
    assert [b["status"] for b in everything(client)] == ["cancelled"]
    again = client.call("book", cards=[1], start=start, end=start + HOUR)  # the slot is free again
    assert again["id"] != booking["id"]
    with pytest.raises(BadInput):
        client.call("cancel", id=booking["id"])


def test_release_ends_an_active_booking_now(client):
    now = int(time.time())
    booking = client.call("book", cards=[6], start=now - 30, end=now + HOUR)  # started half a minute ago
    released = client.call("release", id=booking["id"])
    after = int(time.time())
    assert released["status"] == "booked"  # its past stays as history
    assert now <= released["end"] <= after + 1
    start = tomorrow()
    future = client.call("book", cards=[6], start=start, end=start + HOUR)
    with pytest.raises(BadInput, match="cancel it instead"):  # a future one is cancelled, not released
        client.call("release", id=future["id"])


def test_extend_by_duration_and_to_an_end(client):
    start = tomorrow()
    booking = client.call("book", cards=[2], start=start, end=start + HOUR)
    longer = client.call("extend", id=booking["id"], add_seconds=HOUR)
    assert longer["end"] == start + 2 * HOUR
    longer = client.call("extend", id=booking["id"], end=start + 3 * HOUR)
    assert longer["end"] == start + 3 * HOUR
    with pytest.raises(BadInput):
        client.call("extend", id=booking["id"], end=start + HOUR)  # shorter is not an extension
    client.call("book", cards=[2], start=start + 3 * HOUR, end=start + 4 * HOUR)
    with pytest.raises(Conflict):
        client.call("extend", id=booking["id"], add_seconds=HOUR)
    assert client.call("get", id=booking["id"])["end"] == start + 3 * HOUR


def test_unknown_booking_is_bad_input(client):
    for op in ("get", "cancel", "release"):
        with pytest.raises(BadInput, match="no booking 999"):
            client.call(op, id=999)
    with pytest.raises(BadInput, match="no booking 999"):
        client.call("extend", id=999, add_seconds=60)


# -- listing ------------------------------------------------------------------------------------


def test_list_mine_user_and_window(client):
    start = tomorrow()
    early = client.call("book", cards=[0], start=start, end=start + HOUR)
    late = client.call("book", cards=[1], start=start + 5 * HOUR, end=start + 6 * HOUR)
    ids = [early["id"], late["id"]]
    assert [b["id"] for b in client.call("list")["bookings"]] == ids
    assert [b["id"] for b in client.call("list", mine=True)["bookings"]] == ids
    assert [b["id"] for b in client.call("list", user=ME)["bookings"]] == ids
    assert [b["id"] for b in client.call("list", start=start + 4 * HOUR, end=start + 7 * HOUR)["bookings"]] == [late["id"]]
    assert [b["id"] for b in client.call("list", start=start, end=start + HOUR)["bookings"]] == [early["id"]]
    with pytest.raises(BadInput, match="no user 'nobody-here'"):
        client.call("list", user="nobody-here")
    window = client.call("window", start=start, end=start + 2 * HOUR)
    assert [b["id"] for b in window["in_window"]] == [early["id"]]
    assert [b["id"] for b in window["upcoming"]] == ids


# -- the audit log ------------------------------------------------------------------------------


def test_log_shows_the_create_as_ok(client):
    start = tomorrow()
    booking = client.call("book", cards=[7], start=start, end=start + HOUR)
    events = events_of(client, booking["id"])
    assert [(e["action"], e["ok"], e["actor"], e["uid"]) for e in events] == [("create", True, ME, UID)]
    assert events[0]["details"]["cards"] == [7]
    client.call("cancel", id=booking["id"])
    assert [e["action"] for e in events_of(client, booking["id"])][0] == "cancel"  # newest first
    assert len(events_of(client, limit=1)) == 1
    with pytest.raises(BadInput):
        client.call("log", limit=0)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("change, words", [
    ({"end": -HOUR}, "end must be after the start"),
    ({"class": "gaming"}, "unknown class 'gaming'"),
    ({"cards": [42]}, "unknown card 42"),
    ({"cards": None, "count": 3}, "1, 2, 4 or 8"),
    ({"start": 1_000_000}, "in the past"),
    ({"cards": None}, "say which cards"),
    ({"count": 1}, "not both"),
])
def test_bad_bookings_are_exit_2_and_write_nothing(client, change, words):
    start = tomorrow()
    args = {"cards": [0], "start": start, "end": start + HOUR}
    if change.get("end") == -HOUR:
        change = {"end": start - HOUR}
    args.update(change)
    events_before = events_of(client)
    with pytest.raises(BadInput, match=words) as refused:
        client.call("book", **{k: v for k, v in args.items() if v is not None})
    assert refused.value.exit_code == 2
    assert everything(client) == [] and events_of(client) == events_before


@pytest.mark.parametrize("op, args", [
    ("book", {"start": "tomorrow", "end": 5, "cards": [0]}),  # a string for a time
    ("book", {"start": 1, "end": 5, "cards": [True]}),  # a bool for a card
    ("cancel", {}),  # a missing id
    ("cancel", {"id": 1, "why": "x"}),  # an unknown argument
    ("nonsense", {}),  # an unknown operation
])
def test_malformed_calls_are_exit_2(client, op, args):
    with pytest.raises(BadInput):
        client.call(op, **args)


# -- who and what -------------------------------------------------------------------------------


def test_whoami(client, target):
    me = client.call("whoami")
    assert (me["user"], me["uid"], me["admin"]) == (ME, UID, ADMIN)
    assert me["transport"] == target.transport
    assert (me["db"] is None) == (target.transport == "socket")  # the socket never shows where the file is


def test_status_shape(client):
    start = int(time.time())
    booked = client.call("book", cards=[3], start=start, end=start + HOUR)
    status = client.call("status")
    assert set(status) == {"simulated", "taken_at", "host", "hosts", "cards"}
    assert status["simulated"] is True and isinstance(status["taken_at"], (int, float))
    assert [c["index"] for c in status["cards"]] == list(range(8))
    for card in status["cards"]:
        assert {"host", "index", "uuid", "name", "label", "memory_total_mib", "memory_used_mib", "utilization_pct",
                "temperature_c", "power_w", "power_limit_w", "pci_bus_id", "state", "warnings", "users", "booking",
                "next_booking", "processes"} <= set(card)
    card = status["cards"][3]
    assert card["state"] == "BOOKED" and card["booking"]["id"] == booked["id"]
    assert set(card["booking"]) == BOOKING_KEYS
    assert status["cards"][4]["state"] == "FREE" and status["cards"][4]["booking"] is None


# -- board run ----------------------------------------------------------------------------------


def test_run_without_an_active_booking_is_refused_and_audited(client):
    with pytest.raises(NotPermitted, match="no active booking") as refused:
        client.call("run")
    assert refused.value.exit_code == 4
    start = tomorrow()
    future = client.call("book", cards=[0], start=start, end=start + HOUR)
    with pytest.raises(NotPermitted, match="not active"):
        client.call("run", booking=future["id"])
    runs = [e for e in events_of(client) if e["action"] == "run"]
    assert [(e["ok"], e["booking_id"]) for e in runs] == [(False, future["id"]), (False, None)]
    assert all(e["details"]["refused"] for e in runs)
    now = int(time.time())
    active = client.call("book", cards=[1], start=now, end=now + HOUR)
    assert client.call("run")["id"] == active["id"]


# -- subscribe ----------------------------------------------------------------------------------


def _collect(client, kinds, into: queue.Queue) -> threading.Thread:
    def read():
        try:
            for event in client.subscribe(kinds):
                into.put(event)
        except Exception as error:  # noqa: BLE001 - the test reports it
            into.put({"event": "crashed", "error": repr(error)})

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _wait_for(events: queue.Queue, kind: str, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            event = events.get(timeout=0.2)
        except queue.Empty:
            continue
        assert event["event"] != "crashed", event
        seen.append(event["event"])
        if event["event"] == kind:
            return event
    raise AssertionError(f"no {kind!r} event within {timeout:g} s; saw {seen}")


def test_a_cli_booking_is_pushed_to_subscribers(client, cli):
    events: queue.Queue = queue.Queue()
    _collect(client, ("bookings",), events)
    time.sleep(1.5)  # the subscription is in place (the local watcher takes its first look)
    while not events.empty():
        events.get()
    rc, out, err = cli("book", "--cards", "2", "--start", "tomorrow 10:00", "--for", "1h", "--json")
    assert rc == 0, err
    event = _wait_for(events, "bookings")
    assert isinstance(event["version"], int) and event["version"] >= 1
    assert json.loads(out)["cards"] == [2]


# -- the real CLI on the same transport ----------------------------------------------------------


def test_cli_exit_codes_and_one_line_errors(cli):
    rc, out, err = cli("book", "--cards", "0,1", "--start", "tomorrow 9:00", "--for", "2h", "--json")
    assert rc == 0 and err == "", err
    booking = json.loads(out)
    assert set(booking) == CLI_BOOKING_KEYS and booking["cards"] == [0, 1] and booking["user"] == ME

    rc, out, err = cli("book", "--cards", "1", "--start", "tomorrow 10:00", "--for", "1h")
    assert rc == 3 and out == ""
    assert "next free start" in one_line_error(err)

    for args, words in (
        (("book", "--cards", "99", "--for", "1h"), "unknown card 99"),
        (("book", "1", "--start", "tomorrow 9:00", "--until", "2020-01-01T08:00"), "is at or before the start"),
        (("book", "1", "--for", "1h", "--class", "gaming"), "unknown class"),
        (("cancel", "4242"), "no booking 4242"),
        (("list", "--user", "nobody-here"), "no user 'nobody-here'"),
    ):
        rc, out, err = cli(*args)
        assert rc == 2, (args, rc, err)
        assert words in one_line_error(err)

    rc, out, err = cli("extend", str(booking["id"]), "--for", "1h", "--json")
    assert rc == 0, err
    assert json.loads(out)["end"].endswith("T12:00:00+00:00")
    rc, out, err = cli("cancel", str(booking["id"]))
    assert rc == 0 and out.startswith("cancelled #"), err
    rc, out, err = cli("list", "--json")
    assert rc == 0 and json.loads(out) == {"bookings": []}

    rc, out, err = cli("log", "--json")
    assert rc == 0, err
    actions = [(e["action"], e["ok"]) for e in json.loads(out)["events"]]
    assert actions == [("cancel", True), ("extend", True), ("create", False), ("create", True)]


def test_cli_whoami_and_status(cli, target):
    rc, out, err = cli("whoami", "--json")
    assert rc == 0, err
    me = json.loads(out)
    assert (me["user"], me["admin"], me["transport"]) == (ME, ADMIN, target.transport)
    rc, out, err = cli("status", "--json")
    assert rc == 0, err
    status = json.loads(out)
    assert status["simulated"] is True and len(status["cards"]) == 8
    rc, out, err = cli("status")
    assert rc == 0 and "SIMULATED" in out.splitlines()[0], err


def test_cli_run_refusal_is_exit_4_and_audited(cli):
    rc, out, err = cli("run", "--", "true")
    assert rc == 4 and "no active booking" in one_line_error(err)
    rc, out, err = cli("log", "--json")
    events = json.loads(out)["events"]
    assert [(e["action"], e["ok"]) for e in events] == [("run", False)]

"""What a member sends is checked where it comes in, and what other members see of it is inert.

- `book`'s `request` (what `book --model` stores and every `board list` shows): known keys only, each
  in its type and range; anything else is code 2 and writes nothing.
- A row stored before that check (written here straight into SQLite, past the service) never stops
  `board list` or `board status`, and its text reaches no terminal raw.
- Valid JSON that is not a time (start 1e300, -1e18, 2**62) or not Unicode text (a lone surrogate
  "\\ud800") is code 2, never code 1, for every operation; `subscribe` with kinds that are not names
  is a code-2 reply, not a dead thread.

Each test runs in process and through the real socket (the agent as the unit runs it; root needed).
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from app.errors import BoardError
from app.store import bookings
from tests.service.support import Raw

HOUR = 3600
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m"  # a window title, clear screen, red
GOOD = {"model": "/models/tiny.gguf", "ctx": 256, "parallel": 1, "cache_type_k": "f16", "cache_type_v": "q8_0",
        "flash_attn": True, "unified": False, "cards_planned": 1, "per_card_mib": [700],
        "estimate": [{"weights_mib": 1.5, "kv_mib": 0.5, "compute_mib": 200.0, "overhead_mib": 500.0, "total_mib": 702.0}]}


def tomorrow(hours: float = 0) -> int:
    return (int(time.time()) // HOUR + 24) * HOUR + int(hours * HOUR)


def refused(client, op: str, **args) -> str:
    with pytest.raises(BoardError) as caught:
        client.call(op, **args)
    message = str(caught.value)
    assert caught.value.exit_code == 2, f"{op}: code {caught.value.exit_code}: {message}"
    assert message and "\n" not in message and "Traceback" not in message
    return message


# -- the request ----------------------------------------------------------------------------------


@pytest.mark.parametrize("change, words", [
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"parallel": ESCAPES}, "parallel must be a whole number from 1 to 256"),
    ({"parallel": 257}, "parallel must be a whole number from 1 to 256"),
    ({"parallel": True}, "parallel must be a whole number"),
    ({"ctx": None}, "needs 'ctx'"),
    ({"ctx": "lots"}, "ctx must be a whole number"),
    ({"ctx": 0}, "ctx must be a whole number from 1 to 2147483647"),
    ({"ctx": 2**31}, "ctx must be a whole number from 1 to 2147483647"),
    ({"ctx": 1e300}, "ctx must be a whole number"),
    ({"model": "/models/" + ESCAPES + ".gguf"}, "model must be a file path of 1 to 4096 printable characters"),
    ({"model": "/m" * 2049}, "model must be a file path"),
    ({"cache_type_k": "q3_k"}, "cache_type_k must be one of f32, f16"),
    ({"flash_attn": "on"}, "flash_attn must be true or false"),
    ({"per_card_mib": [700, 700]}, "per_card_mib has 2 cards, not cards_planned (1)"),
    ({"per_card_mib": ["700"]}, "per_card_mib must be a list of 1 to 64 whole MiB figures"),
    ({"estimate": [{"total_mib": 1.0}]}, "estimate must be a list of 1 to 64 cards"),
    ({"estimate": [{**GOOD["estimate"][0], "total_mib": float("inf")}]}, "estimate must be"),
])
def test_a_request_out_of_its_schema_is_code_2_and_writes_nothing(client, change, words):
    request = {key: value for key, value in {**GOOD, **change}.items() if value is not None}
    start = tomorrow()
    message = refused(client, "book", count=1, start=start, end=start + HOUR, request=request)
    assert message.startswith("book: request ") and words in message, message
    assert client.call("list", start=0, include_cancelled=True)["bookings"] == []
    assert client.call("log") == []


@pytest.mark.parametrize("request_", [
    {**GOOD, "ctx": 1, "parallel": 1},
    {**GOOD, "ctx": 2**31 - 1, "parallel": 256},
    {**GOOD, "model": "/models/名前 with spaces.gguf"},  # printable is not ASCII
    {key: GOOD[key] for key in ("model", "ctx", "parallel")},  # only what is needed
])
def test_a_request_at_the_edges_of_its_schema_is_booked_and_kept(client, request_):
    start = tomorrow()
    booking = client.call("book", count=1, start=start, end=start + HOUR, request=request_)
    assert booking["request"] == request_
    assert client.call("get", id=booking["id"])["request"] == request_


# -- rows stored before the check -----------------------------------------------------------------

ODD = [
    {"model": "/m/" + ESCAPES + "x.gguf", "parallel": ESCAPES, "ctx": "lots", "per_card_mib": ["x"]},
    {"model": "/m/no-ctx.gguf", "parallel": 2},  # no ctx: `board list` used to fail on '?' with a ',' format
    {"model": "/m/bad-ctx.gguf", "ctx": [1], "parallel": {"a": 1}, "per_card_mib": [True]},
    {"model": 7, "ctx": 256},
]


def store_odd_rows(target, client) -> list[int]:
    """Bookings whose requests the service would refuse now, written straight into the database file."""
    db = target.agent.db if target.agent is not None else target.db
    client.call("list")  # the service has made the file and its card rows
    uuids = [card["uuid"] for card in client.call("status")["cards"]]
    now = int(time.time())
    ids = []
    if target.url:  # PostgreSQL: the same rows, through a connection of the test's own
        from app.config import PostgresStore
        from app.store.db import connect, write

        raw = connect(PostgresStore(target.url, host="test"))
        with write(raw):  # its foreign keys hold, unlike a bare sqlite3 connection's: the cards first
            raw.executemany("INSERT INTO cards (uuid, idx, seen_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                            [(uuid, n, now) for n, uuid in enumerate(uuids)])
            for n, request in enumerate(ODD):
                ids.append(bookings.insert(raw, user="mallory", uid=4242, uuids=[uuids[n]], start=now - 60,
                                           end=now + HOUR, klass="experiment", note=f"odd {n}", request=request,
                                           now=now, created_by=4242))
        raw.close()
        return ids
    with sqlite3.connect(db, timeout=10) as raw:
        for n, request in enumerate(ODD):
            ids.append(bookings.insert(raw, user="mallory", uid=4242, uuids=[uuids[n]], start=now - 60, end=now + HOUR,
                                       klass="experiment", note=f"odd {n}", request=request, now=now, created_by=4242))
    return ids


def test_list_and_status_survive_old_rows_and_show_them_inert(target, client, cli):
    ids = store_odd_rows(target, client)
    start = tomorrow()
    mine = client.call("book", count=1, start=start, end=start + HOUR, request=GOOD)
    rc, out, err = cli("list")
    assert rc == 0, err
    assert "\x1b" not in out and "\x07" not in out
    lines = {int(line.split()[0][1:]): line for line in out.splitlines() if line.startswith("#")}
    assert set(lines) == {*ids, mine["id"]}, out
    for unreadable in (0, 3):  # a model that is not a printable path: no request is shown at all
        assert lines[ids[unreadable]].endswith(f"experiment  odd {unreadable}"), lines[ids[unreadable]]
    assert "[no-ctx.gguf ctx ? ×2]" in lines[ids[1]], lines[ids[1]]
    assert "[bad-ctx.gguf ctx ? ×?]" in lines[ids[2]], lines[ids[2]]
    assert "[tiny.gguf ctx 256 ×1, ~0.7 GiB/card]" in lines[mine["id"]], lines[mine["id"]]
    rc, out, err = cli("status")
    assert rc == 0 and "\x1b" not in out, err
    rc, out, err = cli("list", "--json")
    assert rc == 0 and "\x1b" not in out and len(json.loads(out)["bookings"]) == len(ODD) + 1, err


# -- values that are valid JSON but not what the service takes ------------------------------------

LONE = "\ud800"


def extreme_calls(start: int) -> list[tuple[str, dict]]:
    return [
        ("book", {"count": 1, "start": 1e300, "end": start}),
        ("book", {"count": 1, "start": -10**18, "end": start}),
        ("book", {"count": 1, "start": 2**70, "end": 2**70 + HOUR}),
        ("book", {"count": 1, "start": 2**62, "end": 2**62 + HOUR}),
        ("book", {"cards": [0], "start": -(2**63) + 1, "end": start}),
        ("plan", {"count": 1, "start": -10**18, "end": start}),
        ("next_free", {"count": 1, "start": -10**18, "end": start}),
        ("slots", {"count": 1, "start": 2**63 - 1, "end": start}),
        ("list", {"start": -10**18}),
        ("extend", {"id": 1, "add_seconds": 2**62}),
        ("move", {"id": 1, "start": 2**62, "end": 2**62 + HOUR}),
        ("all_bookings", {"since": 2**63 - 1}),
        ("series_book", {"cards": [3], "every": "day", "start": "9:00", "until": "10:00", "from": "9999-12-30",
                         "to": "9999-12-31"}),
        ("list", {"user": LONE}),
        ("serve_list", {"user": LONE}),
        ("book", {"count": 1, "start": start, "end": start + HOUR, "note": "a" + LONE}),
        ("book", {"count": 1, "start": start, "end": start + HOUR, "class": LONE}),
        ("book", {"count": 1, "start": start, "end": start + HOUR, "request": {**GOOD, "model": "/m/" + LONE}}),
        ("book", {"count": 1, "start": start, "end": start + HOUR, "request": {LONE: 1}}),
        ("reassign", {"id": 1, "user": LONE}),
        ("faults", {"since": 0, "kind": LONE}),
    ]


def test_extreme_epochs_and_lone_surrogates_are_code_2(client):
    start = tomorrow()
    client.call("book", count=1, start=start, end=start + HOUR)  # booking 1, for extend, move and reassign
    for op, args in extreme_calls(start):
        refused(client, op, **args)
    # The other side of the line: a surrogate pair is one character, and the far end of the range is a time.
    booked = client.call("book", count=1, start=start, end=start + HOUR, note="ok \ud83d\ude00")
    assert booked["note"] == "ok \U0001f600"
    assert client.call("list", start=0, end=221845392000)["bookings"]


def test_a_lone_surrogate_on_the_wire_is_code_2(agent):
    raw = Raw(agent.socket)
    for line in (b'{"v": 1, "id": 1, "op": "list", "args": {"user": "\\ud800"}}\n',
                 b'{"v": 1, "id": 2, "op": "whoami", "args": {}, "x": ["\\udfff"]}\n',
                 b'{"v": 1, "id": 3, "op": "subscribe", "args": {"kinds": ["\\ud800"]}}\n'):
        raw.send(line)
        reply = raw.reply()
        assert reply["ok"] is False and reply["error"]["code"] == 2, reply
    raw.send(b'{"v": 1, "id": 4, "op": "whoami", "args": {}, "x": "\\ud83d\\ude00"}\n')
    assert raw.reply()["ok"] is True


@pytest.mark.parametrize("kinds", [[[1]], [{}], [1], ["bookings", None], [["bookings"]], "bookings", [], {"a": 1}])
def test_subscribe_with_kinds_that_are_not_names_is_a_code_2_reply(agent, kinds):
    raw = Raw(agent.socket)
    reply = raw.request("subscribe", {"kinds": kinds})
    assert reply["ok"] is False and reply["error"]["code"] == 2, reply
    assert "kinds is a list of" in reply["error"]["message"]
    again = Raw(agent.socket)
    assert again.request("whoami")["ok"] is True
    assert "Traceback" not in agent.log_text()

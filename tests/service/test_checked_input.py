"""What a member sends is checked where it comes in, and what other members see of it is inert.

- `book`'s `request` (what `book --model` stores and every `board list` shows): known keys only, each
  in its type and range; anything else is code 2 and writes nothing.
- A row stored before that check (written here straight into SQLite, past the service) never stops
  `board list` or `board status`, and its text reaches no terminal raw.
- Valid JSON that is not a time (start 1e300, -1e18, 2**62) or not Unicode text (a lone surrogate
  "\\ud800") is code 2, never code 1, for every operation; `subscribe` with kinds that are not names
  is a code-2 reply, not a dead thread.
- The typed requests of the servers, keys, pushes, faults, alerts and power operations, sent by a member: a wrong
  type, an unknown field, a value out of range is code 2 naming the operation and the field's path, and writes
  nothing; a value at the edge of its range passes the door (to the next check: who asks, or what exists).

Each test runs in process and through the real socket (the agent as the unit runs it; root needed); the typed
requests' tests as alice, a member, in a process of her own (tests/service/test_service_permissions.py's worlds).
"""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from app.errors import BoardError
from app.service.ops.registry import TIME_HIGH
from app.store import bookings
from tests.service.support import Raw
from tests.service.test_service_permissions import opened_world
from tests.users.conftest import unix_users  # noqa: F401 - the users, as tests/users has them

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


# -- the typed requests, sent by a member ---------------------------------------------------------

RECORD = {"ts": 1, "status": 200, "prompt_tokens": 1, "completion_tokens": 1, "duration_ms": 1}
INT64 = "9223372036854775807"
ALICE_REFUSED = [
    ("serve_start", {"booking": "1"}, "expected int, got str at $.booking"),
    ("serve_start", {"booking": 1, "extra": ["--no-mmap", 7]}, "expected str, got int at $.extra[1]"),
    ("serve_start", {"booking": 1, "port": 2**64}, f"expected int <= {INT64} at $.port"),
    ("serve_start", {"booking": 1, "colour": "red"}, "unknown argument 'colour'"),
    ("serve_get", {"id": 1.5}, "expected int, got float at $.id"),
    ("serve_list", {"all": "yes"}, "expected bool, got str at $.all"),
    ("serve_logs", {"id": 1, "lines": 100_001}, "expected int <= 100000 at $.lines (a count from 0 to 100000)"),
    ("serve_logs", {"id": 1, "lines": -1}, "expected int >= 0 at $.lines"),
    ("serve_stop", {"id": 1, "reason": 5}, "expected str | null, got int at $.reason"),
    ("serve_key", {"id": 1, "key": "x"}, "unknown argument 'key'"),
    ("serve_plan", {"booking": 1, "port": 8080}, "unknown argument 'port'"),  # a planned server leases one at start
    ("serve_plan", {"series": 1, "fit": [1]}, "expected object | null, got array at $.fit"),
    ("serve_plans", {"all": 1}, "expected bool, got int at $.all"),
    ("serve_plan_cancel", {}, "missing argument 'id'"),
    ("notify_test", {"target": ["chat"]}, "expected str | null, got array at $.target"),
    ("notify_status", {"ids": [0]}, "expected int >= 1 at $.ids[0]"),
    ("notify_status", {"ids": list(range(1, 102))}, "expected array of length <= 100 at $.ids"),
    ("faults", {}, "missing argument 'since'"),
    ("faults", {"since": -1}, "expected int >= 0 at $.since (a time from 1970 to 9000, epoch seconds)"),
    ("faults", {"since": 0, "kind": 1}, "expected str | null, got int at $.kind"),
    ("alerts", {"limit": 0}, "expected int >= 1 at $.limit (a count from 1 to 10000)"),
    ("alerts", {"limit": 10_001}, "expected int <= 10000 at $.limit"),
    ("key_new", {"class": 1}, "expected str | null, got int at $.class"),
    ("key_new", {"klass": "batch"}, "unknown argument 'klass'"),  # the wire says `class`, and only that
    ("key_new", {"models": "team-llm"}, "expected array | null, got str at $.models"),
    ("key_new", {"expires": TIME_HIGH + 1}, f"expected int <= {TIME_HIGH} at $.expires"),
    ("key_list", {"all": 0}, "expected bool, got int at $.all"),
    ("key_revoke", {"id": "1"}, "expected int, got str at $.id"),
    ("gateway_state", {"x": 1}, "unknown argument 'x'"),
    ("gateway_usage", {"records": [{"ts": 1}]}, "object missing required field status at $.records[0]"),
    ("gateway_usage", {"records": [{**RECORD, "cost": 1}]}, "unknown argument 'cost' at $.records[0]"),
    # a field's name is the sender's: cut to 40 characters and shown inert, nested as at the top
    ("gateway_usage", {"records": [{**RECORD, "\x1b[2J" + "x" * 5000: 1}]},
     "unknown argument '\\x1b[2J" + "x" * 36 + "' at $.records[0]"),
    ("gateway_usage", {"records": [{**RECORD, "prompt_tokens": 2**53}]},
     "expected int <= 9007199254740991 at $.records[0].prompt_tokens"),
    ("gateway_usage", {"records": [RECORD] * 1001}, "expected array of length <= 1000 at $.records"),
    ("usage", {"since": 2**62}, f"expected int <= {TIME_HIGH} at $.since"),
    ("usage", {"by": ["user"]}, "expected str, got array at $.by"),
    ("power", {"card": 0}, "unknown argument 'card'"),
    ("power_step", {"card": 0, "limit_w": 500.5}, "expected int | null, got float at $.limit_w"),
    ("power_step", {"card": True, "persistence": True}, "expected int, got bool at $.card"),
]


@pytest.fixture(scope="module", params=["local", "socket"])
def world(request):
    for made in opened_world(request, "board-checked-", 39000):
        made.root.call("key_list")  # the database is made (in process, on first use)
        yield made


def written(world) -> tuple:
    """What a refused request must leave as it was: the bookings and servers, keys, accounting, outbox, audit log."""
    return (world.written(), world.mark(), *(world.rows(f"SELECT count(*) FROM {table}")
                                            for table in ("api_keys", "gateway_usage", "outbox", "server_plans")))


@pytest.mark.real_users
def test_a_members_mistyped_unknown_or_out_of_range_argument_is_code_2_naming_its_path(world):
    """Each of alice's requests is refused at the door with its operation and the field's path, and writes nothing.
    Nearest wrong versions, each failing here: a bound dropped (serve_logs' lines, alerts' limit, an outbox id,
    a record's count: the request passes to the next check); serve_plan's request taking serve_start's (port
    accepted); key_new's request not a Request (`class` unchecked, unknown fields ignored); a usage record that
    ignores unknown fields; a nested unknown field's name echoed whole and raw; an admin's operation
    (notify_status, power_step) that asks who calls before it checks the request (code 4)."""
    before = written(world)
    for op, args, words in ALICE_REFUSED:
        with pytest.raises(BoardError) as refused:
            world["alice"].call(op, **args)
        message = str(refused.value)
        assert (refused.value.exit_code, message.startswith(f"{op}: "), words in message) == (2, True, True), message
        assert "\n" not in message
    assert written(world) == before


ALICE_AT_THE_EDGES = [
    ("serve_logs", {"id": 999_999, "lines": 100_000}, 2, "no server 999999"),
    ("serve_logs", {"id": 999_999, "lines": 0}, 2, "no server 999999"),
    ("notify_status", {"ids": [1, 2**63 - 1, *range(2, 100)]}, 4, "is for admins"),
    ("power_step", {"card": 0, "limit_w": 500}, 4, "is for admins"),
    ("gateway_usage", {"records": [RECORD] * 1000}, 4, "is the gateway's own operation"),
    ("serve_plan_cancel", {"id": 2**63 - 1}, 2, f"no planned server {2**63 - 1}"),
]


@pytest.mark.real_users
def test_a_members_request_at_the_edges_of_its_ranges_passes_the_door(world):
    """At each bound the request is taken, and the next check answers: alerts and faults answer, an admin's or the
    gateway's operation refuses alice for who she is (code 4), a server or plan that does not exist is named.
    Wrong versions: a bound moved inwards (lines up to 99999, limit up to 9999, ids from 2, 999 records)."""
    assert world["alice"].call("alerts", limit=1) == world["alice"].call("alerts", limit=10_000) == []
    assert world["alice"].call("faults", since=TIME_HIGH)["faults"] == []
    assert world["alice"].call("usage", since=0)["rows"] == []
    for op, args, code, words in ALICE_AT_THE_EDGES:
        with pytest.raises(BoardError) as refused:
            world["alice"].call(op, **args)
        assert (refused.value.exit_code, words in str(refused.value)) == (code, True), (op, str(refused.value))

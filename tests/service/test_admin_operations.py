"""Every operation that only some callers may make, from both sides, as one table: the same arguments refused to
those who may not (exit code and words, nothing written, the refusal audited exactly where the design audits it)
and done for the one who may (its effect, and its audit event where there is one).

Who may: an admin (group boardadmins), the holder (of a booking, a series, a plan), the gateway's account
([gateway] user) or the runner's ([llama] runner_user). The worlds are tests/service/test_service_permissions.py's:
in process (identities given) and the real agent on its socket, each user a process of their own, so that the
service knows who asks only from SO_PEERCRED. What that module already tests from both sides (cancel, release,
extend, reassign, run, serve_start, serve_stop) is named in ELSEWHERE; every other operation in the registry is
OPEN, and test_every_operation_that_checks_who_asks_is_in_the_table keeps the three lists whole.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sqlite3
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pytest

from app.errors import BadInput, NotPermitted
from tests.service.test_service_permissions import (
    HOUR, MODEL, Remote, Stream, World, now, opened_world, socket_only, tomorrow, uid)
from tests.unix_users import ADMIN_GROUP, GATEWAY_USER, RUNNER_USER, ensure_system_user
from tests.users.conftest import unix_users  # noqa: F401 - the users, as tests/users has them

pytestmark = pytest.mark.real_users

MODELS = "/models"  # MODEL lies here: a plan's model must lie in [llama] model_dirs (taken as text, never opened)
# Appended to the worlds' [llama] table (config_extra ends with it), then the one notify target: a port that
# refuses at once, so that a test message fails without waiting.
EXTRA = (f'model_dirs = ["{MODELS}"]\n'
         '\n[[notify.targets]]\nname = "ops"\ntype = "webhook"\nurl = "http://127.0.0.1:9/board-test"\n')
KEY = "sk-server-key-of-alices-server"


@pytest.fixture(scope="module", params=["local", "socket"])
def world(request):
    for user in (GATEWAY_USER, RUNNER_USER):
        ensure_system_user(user)
    for made in opened_world(request, "board-admin-ops-", 33000, EXTRA):
        if made.transport == "socket":
            made.callers[GATEWAY_USER] = Remote(GATEWAY_USER, made.agent.socket)
        else:
            from app.client.local import LocalClient
            from app.core.identity import Identity

            made.callers[GATEWAY_USER] = LocalClient(made.root.service, Identity(GATEWAY_USER, uid(GATEWAY_USER),
                                                                                 False))
            made.root.call("key_list")  # the database is made (in process, on first use)
        yield made


@pytest.fixture(autouse=True)
def clean(request):
    """After each test root ends every live booking and plan and revokes every key: the next starts afresh."""
    yield
    if "world" not in request.fixturenames:
        return
    world = request.getfixturevalue("world")
    for plan in world.root.call("serve_plans"):
        world.root.call("serve_plan_cancel", id=plan["id"])
    for booking in world.root.call("list", start=now())["bookings"]:
        try:
            world.root.call("release", id=booking["id"])
        except BadInput:  # not started yet
            world.root.call("cancel", id=booking["id"])
    for key in world.root.call("key_list", all=True):
        if key["revoked"] is None:
            world.root.call("key_revoke", id=key["id"])


# -- what alice holds, made for one row -------------------------------------------------------------------


def series_args(card: int) -> dict:
    first = datetime.now(timezone.utc).date() + timedelta(days=2)
    return {"cards": [card], "every": "day", "start": "9:00", "until": "10:00", "from": first.isoformat(),
            "to": (first + timedelta(days=2)).isoformat()}


def alices_series(world: World, card: int) -> dict:
    return world["alice"].call("series_book", **series_args(card))["series"]


def alices_server(world: World, card: int) -> dict:
    """A server on alice's booking that has started (its key recorded, as its supervisor reports it)."""
    booking = world.book("alice", card, now())
    server = world["alice"].call("serve_start", booking=booking["id"], model=MODEL)["server"]
    set_server(world, server["id"], api_key=KEY)
    return server


def set_server(world: World, server_id: int, **columns: Any) -> None:
    """Write what a server's supervisor would have reported (its key, its log) into its row, as root."""
    conn = sqlite3.connect(world.db, timeout=30)
    try:
        with conn:
            conn.execute(f"UPDATE servers SET {', '.join(f'{c} = ?' for c in columns)} WHERE id = ?",
                         (*columns.values(), server_id))
    finally:
        conn.close()


def alices_key(world: World) -> dict:
    return world["alice"].call("key_new", name="alices")


# -- the table -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Guarded:
    """One operation: `setup` makes what it acts on and returns the arguments every caller sends; each of `refused`
    gets `error` whose words match `words` (formatted with the arguments and `made`), audited as `audited` (on the
    booking `on` names) or not at all (None); then `allowed` calls with the same arguments, `check` sees what it did
    and the audit log holds `done`.
    """

    name: str
    op: str
    setup: Callable[[World], tuple[dict, dict]]  # (the arguments, what else the row made)
    words: str
    check: Callable[[World, dict, dict, Any], None]  # (world, args, made, the allowed call's answer)
    refused: tuple[str, ...] = ("bob",)
    allowed: str = "carol"
    error: type = NotPermitted
    audited: str | None = None
    on: str | None = None  # the key in `made` of the booking the refusal is audited on
    done: tuple[str, ...] = ()  # the allowed call's audit events (reads write none)


def only_admins(what: str) -> str:
    return f"^only admins \\(group {ADMIN_GROUP}\\) {what}$"


def setup_key_new(world):
    return {"user": "alice", "name": "for alice"}, {}


def check_key_new(world, args, made, got):
    assert (got["user"], got["name"]) == ("alice", "for alice")
    assert world.rows("SELECT user, uid, created_by FROM api_keys WHERE id = ?", got["id"]) == [
        ("alice", uid("alice"), uid("carol"))]


def setup_key_list(world):
    return {"all": True}, {"alice": alices_key(world)["id"], "bob": world["bob"].call("key_new")["id"]}


def setup_key_revoke(world):
    key = alices_key(world)
    return {"id": key["id"]}, {}


def check_key_revoke(world, args, made, got):
    assert got["user"] == "alice" and got["revoked"] is not None
    assert world.rows("SELECT revoked_at IS NOT NULL FROM api_keys WHERE id = ?", args["id"]) == [(1,)]


def setup_server(card: int):
    def setup(world):
        server = alices_server(world, card)
        return {"id": server["id"]}, {"booking": server["booking_id"]}
    return setup


def check_serve_key(world, args, made, got):
    assert got == {"id": args["id"], "key": KEY}


def check_serve_logs(world, args, made, got):
    assert got["lines"] == [] and got["log"] is None  # the lines, not where alice keeps them


def setup_plan(world):
    booking = world.book("alice", 6, tomorrow())
    return {"booking": booking["id"], "model": MODEL}, {"booking": booking["id"]}


def check_plan(world, args, made, got):
    assert (got["user"], got["booking"], got["model"], got["cancelled"]) == ("alice", args["booking"], MODEL, None)


def setup_plan_cancel(world):
    booking = world.book("alice", 7, tomorrow())
    plan = world["alice"].call("serve_plan", booking=booking["id"], model=MODEL)
    return {"id": plan["id"]}, {"booking": booking["id"]}


def check_plan_cancel(world, args, made, got):
    assert got["id"] == args["id"] and got["user"] == "alice" and got["cancelled"] is not None
    assert [p["id"] for p in world.root.call("serve_plans")] == []


def setup_move(world):
    booking = world.book("alice", 2, tomorrow())
    return {"id": booking["id"], "start": tomorrow(2), "end": tomorrow(3)}, {"booking": booking["id"]}


def check_move(world, args, made, got):
    assert (got["id"], got["user"], got["start"], got["end"]) == (args["id"], "alice", args["start"], args["end"])


def setup_earliest(world):
    world.book("alice", 3, tomorrow())
    return {"start": tomorrow(), "duration": HOUR, "cards": [3], "user": "alice"}, {}


def check_earliest(world, args, made, got):
    assert isinstance(got["words"], str) and got["words"]


def setup_series(card: int):
    def setup(world):
        series = alices_series(world, card)
        return {"id": series["id"]}, {"series": series["id"]}
    return setup


def setup_series_extend(world):
    series = alices_series(world, 4)
    to = datetime.fromisoformat(series_args(4)["to"]).date() + timedelta(days=2)
    return {"id": series["id"], "to": to.isoformat()}, {}


def check_series_extend(world, args, made, got):
    assert got["series"]["user"] == "alice" and len(got["bookings"]) == 2
    assert {b["user"] for b in got["bookings"]} == {"alice"}


def check_series_cancel(world, args, made, got):
    assert got["series"]["id"] == args["id"] and len(got["cancelled"]) == 3
    assert world["alice"].call("list", start=now(), user="alice")["bookings"] == []


def setup_override(world):
    return {**series_args(5), "override_policy": True}, {}


def check_override(world, args, made, got):
    assert got["series"]["user"] == "carol" and len(got["bookings"]) == 3


def setup_power(world):
    return {"card": 2, "limit_w": 301}, {}


def check_power(world, args, made, got):
    assert got == {"card": 2, "from_w": got["from_w"], "to_w": 301} and got["from_w"] != 301
    assert world.root.call("power")["cards"][2]["limit_w"] == 301


def setup_persistence(world):
    on = world.root.call("power")["cards"][3]["persistence"]
    return {"card": 3, "persistence": not on}, {}


def check_persistence(world, args, made, got):
    assert got == {"card": 3, "on": args["persistence"]}
    assert world.root.call("power")["cards"][3]["persistence"] is args["persistence"]


def setup_notify_test(world):
    return {}, {}


def check_notify_test(world, args, made, got):
    assert len(got["ids"]) == 1 and world.rows("SELECT target FROM outbox WHERE id = ?", got["ids"][0]) == [("ops",)]


def setup_notify_status(world):
    return {"ids": world.root.call("notify_test")["ids"]}, {}


def check_notify_status(world, args, made, got):
    assert [(r["id"], r["target"]) for r in got] == [(args["ids"][0], "ops")]


def setup_gateway_state(world):
    return {}, {"key": alices_key(world)["id"]}


def check_gateway_state(world, args, made, got):
    [key] = [k for k in got["keys"] if k["id"] == made["key"]]
    assert key["user"] == "alice" and key["hash"]
    assert world.root.call("gateway_state")["keys"] == got["keys"]  # root too


def setup_models_touch(world):
    return {"aliases": ["team-llm"]}, {}


def check_models_touch(world, args, made, got):
    assert got == {"extended": {}}  # the worlds have no catalog ([[models]]): nothing lives to extend


RECORD = {"ts": 1_700_000_000, "status": 200, "prompt_tokens": 11, "completion_tokens": 7, "duration_ms": 5,
          "user": "alice", "model": "m"}


def setup_gateway_usage(world):
    return {"records": [RECORD]}, {}


def check_gateway_usage(world, args, made, got):
    assert got == {"recorded": 1}
    assert world.rows("SELECT user, prompt_tokens FROM gateway_usage WHERE ts = ?", RECORD["ts"]) == [("alice", 11)]


GATEWAY_ONLY = (r"^{op} is the gateway's own operation \(account " + GATEWAY_USER + r"\)$")
TABLE = [
    Guarded("key_new-for-another", "key_new", setup_key_new, only_admins("issue keys for other accounts"),
            check_key_new, audited="key_new", done=("key_new",)),
    Guarded("key_revoke-anothers", "key_revoke", setup_key_revoke, "^no key {id} of yours; see board key list$",
            check_key_revoke, error=BadInput, done=("key_revoke",)),  # as if it were not there: not audited
    Guarded("serve_key-anothers", "serve_key", setup_server(0),
            "^server {id} belongs to alice; only they or an admin can read its key$", check_serve_key,
            audited="server-key", on="booking"),
    Guarded("serve_logs-anothers", "serve_logs", setup_server(1),
            "^server {id} belongs to alice; only they or an admin can read its log$", check_serve_logs,
            audited="server-logs", on="booking"),
    Guarded("serve_plan_cancel-anothers", "serve_plan_cancel", setup_plan_cancel,
            "^planned server {id} belongs to alice$", check_plan_cancel, audited="server-plan", on="booking",
            done=("server-plan-cancel",)),
    # Only the holder plans a server on her booking: the plan starts it as her.
    Guarded("serve_plan-anothers", "serve_plan", setup_plan, "^booking {booking} belongs to alice$", check_plan,
            refused=("bob", "carol"), allowed="alice", audited="server-plan", on="booking",
            done=("server-plan",)),
    # Not even the holder moves her own booking.
    Guarded("move", "move", setup_move, only_admins("can move bookings"), check_move, refused=("bob", "alice"),
            audited="move", on="booking", done=("move",)),
    Guarded("earliest-under-anothers-limits", "earliest", setup_earliest,
            "^earliest: only admins search under another user's limits$", check_earliest),  # a read: not audited
    Guarded("series_extend-anothers", "series_extend", setup_series_extend,
            "^series {id} belongs to alice; only they or an admin can extend it$", check_series_extend,
            audited="series_extend", done=("create", "create", "series_extend")),
    Guarded("series_cancel-anothers", "series_cancel", setup_series(3),
            "^series {id} belongs to alice; only they or an admin can cancel it$", check_series_cancel,
            audited="series_cancel", done=("cancel", "cancel", "cancel", "series_cancel")),
    Guarded("series_book-override_policy", "series_book", setup_override, only_admins("can pass --override-policy"),
            check_override, audited="series", done=("create", "create", "create", "series")),
    # The member's refusal changes nothing: not audited (the admin's step is).
    Guarded("power_step", "power_step", setup_power,
            f"^changing a card's power is for admins \\(group {ADMIN_GROUP}\\) and root$", check_power,
            done=("power-limit",)),
    Guarded("power_step-persistence", "power_step", setup_persistence,
            f"^changing a card's power is for admins \\(group {ADMIN_GROUP}\\) and root$", check_persistence,
            done=("power-persistence",)),
    Guarded("notify_test", "notify_test", setup_notify_test,
            f"^board notify test is for admins \\(group {ADMIN_GROUP}\\): it posts to the team's chat$",
            check_notify_test, done=("notify-test",)),
    Guarded("notify_status", "notify_status", setup_notify_status,
            f"^board notify status is for admins \\(group {ADMIN_GROUP}\\): it posts to the team's chat$",
            check_notify_status),
    # Every server's API key and every key's hash: the gateway's account alone, admins too are refused.
    Guarded("gateway_state", "gateway_state", setup_gateway_state, GATEWAY_ONLY.format(op="gateway_state"),
            check_gateway_state, refused=("bob", "carol"), allowed=GATEWAY_USER),
    Guarded("gateway_usage", "gateway_usage", setup_gateway_usage, GATEWAY_ONLY.format(op="gateway_usage"),
            check_gateway_usage, refused=("bob", "carol"), allowed=GATEWAY_USER),
    # A member's touch would keep the catalog's cards booked (app.service.rules.ondemand).
    Guarded("models_touch", "models_touch", setup_models_touch, GATEWAY_ONLY.format(op="models_touch"),
            check_models_touch, refused=("bob", "carol"), allowed=GATEWAY_USER),
]

# Those that test_service_permissions.py runs from both sides (the test that does).
ELSEWHERE = {
    "cancel": "test_only_the_holder_or_an_admin_changes_a_booking",
    "release": "test_only_the_holder_or_an_admin_changes_a_booking",
    "extend": "test_only_the_holder_or_an_admin_changes_a_booking",
    "reassign": "test_only_admins_reassign_not_even_the_holder_and_the_new_holder_then_owns_it",
    "run": "test_run_is_only_on_your_own_booking_and_not_for_admins_either",
    "serve_start": "test_only_the_holder_starts_a_server_on_her_booking",
    "serve_stop": "test_only_the_holder_or_an_admin_stops_a_server",
}
# Those that need a catalog ([[models]]) and a runner, which these worlds lack: the test of the module named.
ON_DEMAND = {"model_demand": ("tests.service.test_on_demand_service", "test_a_member_may_not_demand_or_touch")}
# Any member may, and each answers the same whoever asks, but for these, scoped:
# key_list (everyone's keys for admins), serve_get and serve_list (a log's path and tail).
OPEN = set("whoami stats fleet history report status get list window all_bookings log plan next_free slots book"
           " series_get serve_get serve_list serve_plans faults alerts usage power key_list projects models".split())


def written(world: World) -> tuple:
    """What a refusal must leave as it was: bookings and servers (world.written), keys, plans, series, the outbox,
    the gateway's accounting, the cards' power settings."""
    return (world.written(), world.rows("SELECT id, api_key FROM servers ORDER BY id"),
            *(world.rows(f"SELECT * FROM {table} ORDER BY id") for table in
              ("api_keys", "server_plans", "series", "gateway_usage")),
            world.rows("SELECT id FROM outbox ORDER BY id"),  # the service's delivery updates the rows it sends
            [(c["limit_w"], c["persistence"]) for c in world.root.call("power")["cards"]])


@pytest.mark.parametrize("row", TABLE, ids=[row.name for row in TABLE])
def test_only_those_who_may_and_the_same_call_is_done_for_them(world, row):
    """Wrong versions each row fails on: the check dropped (the refused call is done); the other side (the allowed
    caller refused: an admin-only check that asks for root, a holder-only one that lets admins in); the holder's
    check by name rather than uid; the refusal not audited, or audited where the design writes nothing."""
    args, made = row.setup(world)
    before, mark = written(world), world.mark()
    words = re.compile(row.words.format(**{**args, **made}))
    for user in row.refused:
        with pytest.raises(row.error) as refused:
            world[user].call(row.op, **args)
        assert refused.value.exit_code == (4 if row.error is NotPermitted else 2)
        assert words.match(str(refused.value)), str(refused.value)
        found = [event for event in world.events_since(mark) if event[0] == user]
        if row.audited is None:
            assert found == []
        else:
            booking = made[row.on] if row.on else None
            assert [event[:5] for event in found] == [(user, uid(user), row.audited, booking, False)]
            assert found[0][5]["refused" if "refused" in found[0][5] else "why"]
    assert written(world) == before

    got = world[row.allowed].call(row.op, **args)
    row.check(world, args, made, got)
    assert written(world) != before or row.op in ("earliest", "notify_status", "gateway_state", "serve_key",
                                                  "serve_logs", "models_touch")
    done = [(event[2], event[4]) for event in world.events_since(mark) if event[0] == row.allowed]
    assert done == [(action, True) for action in row.done]


# -- a member sees only her own: the answers that are scoped rather than refused -----------------------------------


def test_a_member_lists_only_her_own_keys_even_asking_for_all_and_an_admin_everyones(world):
    """Wrong versions: `all` honoured for anyone (everyone's keys, revoked ones included, to a member); `all`
    ignored for admins (an admin sees only her own)."""
    args, made = setup_key_list(world)
    world["alice"].call("key_revoke", id=made["alice"])
    assert [k["id"] for k in world["bob"].call("key_list", **args)] == [made["bob"]]
    assert {made["alice"], made["bob"]} <= {k["id"] for k in world["carol"].call("key_list", **args)}
    assert world["carol"].call("key_list") == []  # without `all`: her own, as anyone's


def test_a_servers_log_tail_is_for_its_holder_and_admins_and_where_it_lies_for_the_holder_alone(world):
    """serve_get and serve_list, which any member may call, blank what serve_logs refuses. Wrong versions: the tail
    shown to members (the check inverted or dropped: it may hold the prompts the gateway relayed); the path shown to
    admins; the tail hidden from admins."""
    server = alices_server(world, 4)
    tail, path = ["llama: prompt from the gateway"], f"/nonexistent/alice/{server['id']}.log"
    set_server(world, server["id"], log_tail=json.dumps(tail), log_path=path)
    seen = {"alice": (tail, path), "carol": (tail, ""), "bob": ([], "")}
    for user, (lines, where) in seen.items():
        got = world[user].call("serve_get", id=server["id"])
        listed = [s for s in world[user].call("serve_list") if s["id"] == server["id"]]
        assert [(got["log_tail"], got["log_path"])] * 2 == [(got["log_tail"], got["log_path"]),
                                                            *((s["log_tail"], s["log_path"]) for s in listed)]
        assert (got["log_tail"], got["log_path"]) == (lines, where), user


def test_a_per_user_alert_is_shown_to_its_user_alone_admins_too_not(world):
    """alerts: the team's alerts for everyone, one about a member (her idle booking, say) to her alone. Wrong versions:
    the per-user alert shown to admins as well; to everyone; the team's alert hidden from those it does not name."""
    fired = now() - 60
    conn = sqlite3.connect(world.db, timeout=30)
    try:
        with conn:
            ids = [conn.execute("INSERT INTO alerts (rule, subject, state, fired_at, last_seen, message, uid)"
                                " VALUES (?, ?, 'firing', ?, ?, ?, ?)", (rule, subject, fired, fired, message,
                                                                        holder)).lastrowid
                   for rule, subject, message, holder in [("test-team", "card 9", "the team's", None),
                                                          ("test-own", "alice", "alice's own", uid("alice"))]]
    finally:
        conn.close()
    try:
        seen = {user: [a["id"] for a in world[user].call("alerts", all=True) if a["id"] in ids]
                for user in ("alice", "bob", "carol")}
        assert seen == {"alice": ids[::-1], "bob": ids[:1], "carol": ids[:1]}
    finally:
        conn = sqlite3.connect(world.db, timeout=30)
        with conn:
            conn.execute(f"DELETE FROM alerts WHERE id IN ({', '.join('?' * len(ids))})", ids)
        conn.close()


HOLDERS = [row for row in TABLE if row.op in ("key_revoke", "serve_key", "serve_logs", "serve_plan_cancel",
                                              "series_extend", "series_cancel", "serve_plan")]


@pytest.mark.parametrize("world", ["local"], indirect=True)
@pytest.mark.parametrize("row", HOLDERS, ids=[row.name for row in HOLDERS])
def test_the_holder_is_her_uid_not_her_name(world, row):
    """An account named alice under another uid (hers deleted, the name given again) is not her; renamed, she is.
    Wrong versions: the holder matched by name (the row's user) rather than by uid."""
    from app.client.local import LocalClient
    from app.core.identity import Identity

    args, made = row.setup(world)
    before = written(world)
    # Not closed: closing a LocalClient closes the service it shares with the others.
    namesake = LocalClient(world.root.service, Identity("alice", uid("alice") + 10_000, False))
    with pytest.raises(row.error):
        namesake.call(row.op, **args)
    assert written(world) == before
    renamed = LocalClient(world.root.service, Identity("alice-renamed", uid("alice"), False))
    got = renamed.call(row.op, **args)
    if row.op == "serve_logs":  # the holder's own: her file's path too
        assert got["lines"] == [] and got["log"]
    elif row.op == "serve_plan":  # a plan is recorded under its author's name as she asks now
        assert (got["user"], got["booking"]) == ("alice-renamed", args["booking"])
    else:
        row.check(world, args, made, got)


# -- the runner's account: registering as the runner --------------------------------------------------------------


@socket_only
def test_only_the_runners_account_registers_as_the_runner_and_supervises_only_what_a_plan_started(world):
    """Wrong versions: admins or root let in as the runner; any account let in while [llama] runner_user's is
    missing; a second runner let in beside (or in place of) the one registered; the runner's account let supervise
    any server (the plan's check dropped from may_supervise)."""
    own = alices_server(world, 5)  # started by alice herself: no plan of it
    booking = world.book("alice", 6, now())
    world["alice"].call("serve_plan", booking=booking["id"], model=MODEL)
    before, mark = written(world), world.mark()
    for user in ("bob", "carol", "root"):
        refused = Stream(user, world.agent.socket, "register", {"kind": "runner"})
        with pytest.raises(NotPermitted, match=f"^only the user {RUNNER_USER} runs planned servers$") as error:
            refused.first()
        assert error.value.exit_code == 4
        refused.close()
    assert written(world) == before and world.events_since(mark) == []

    runner = Stream(RUNNER_USER, world.agent.socket, "register", {"kind": "runner"})
    supervisors = []
    try:
        assert runner.first() == {"runner": runner.proc.pid}
        second = Stream(RUNNER_USER, world.agent.socket, "register", {"kind": "runner"})
        with pytest.raises(NotPermitted, match="^a runner is registered already$"):
            second.first()
        second.close()
        planned = runner.next_event("start")["server"]  # the plan's occurrence is due: the service starts it as alice
        assert (planned["user"], planned["booking_id"]) == ("alice", booking["id"])
        mark = world.mark()
        supervisors.append(Stream(RUNNER_USER, world.agent.socket, "register", {"kind": "server", "server": own["id"]}))
        with pytest.raises(NotPermitted, match=f"^server {own['id']} belongs to alice$"):
            supervisors[-1].first()
        assert world.refusals_since(mark) == [(RUNNER_USER, uid(RUNNER_USER), "server-register", own["booking_id"])]
        supervisors.append(Stream(RUNNER_USER, world.agent.socket, "register",
                                  {"kind": "server", "server": planned["id"]}))
        assert supervisors[-1].first()["server"] == planned["id"]
    finally:
        for stream in (*supervisors, runner):
            stream.close()


# -- the table is whole ------------------------------------------------------------------------------------------

PERMISSION_WORDS = ("is_admin", "NotPermitted", "_admin(", "_gateway_only", "holder_or_admin")


def test_every_operation_that_checks_who_asks_is_in_the_table():
    """A new operation must be placed: in the table (tested from both sides here), ELSEWHERE, or OPEN; and an OPEN
    one's handler asks nothing of who calls. Wrong versions: a new admin-only operation with no refused-side test;
    an operation moved to OPEN while its handler still checks the caller."""
    from app.operations import OPERATIONS
    from app.service.ops.registry import lookup

    ops = {name: lookup(name) for name in OPERATIONS}
    tabled = {row.op for row in TABLE}
    placed = tabled | set(ELSEWHERE) | set(ON_DEMAND) | OPEN
    assert placed == set(ops), sorted(set(ops) ^ placed)
    assert not tabled & OPEN and not set(ELSEWHERE) & (OPEN | tabled) and not set(ON_DEMAND) & (OPEN | tabled)
    import tests.service.test_service_permissions as elsewhere

    assert all(hasattr(elsewhere, test) for test in ELSEWHERE.values())
    assert all(hasattr(importlib.import_module(module), test) for module, test in ON_DEMAND.values())
    checking = {name for name, op in ops.items() if any(w in inspect.getsource(op.handler) for w in PERMISSION_WORDS)}
    # key_list is scoped (test_a_member_lists_only_her_own_keys_even_asking_for_all...); whoami says who is an admin
    assert checking & OPEN == {"key_list", "whoami"}

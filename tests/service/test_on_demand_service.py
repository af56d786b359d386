"""Models on demand in the service (app.service.rules.ondemand, app.service.ops.models): the real Service and its
ServiceServer in this process, on a real Unix socket with a clock the test moves; the test is the gateway and the
runner both ([gateway] user and [llama] runner_user are its own account): it asks over the socket as a client of
the wire does, registers as the runner there and reads the {"event": "start"} lines it is sent. Enforcement passes
run on the server's database thread, as `board agent` runs them every [enforce] interval_s. Members' calls go
through the same database thread with their identity (the socket tests of who may are
tests/service/test_admin_operations.py's).

On SQLite and on PostgreSQL (`store`). The simulated fleet has 4 cards; pool prod is cards 2 and 3; the catalog's
model is the tests' tiny GGUF (one card holds it).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.config import (AlertSettings, CatalogModel, Config, GatewaySettings, LlamaSettings, Policy, Pool,
                        PreloadWindow, Project, ServiceSettings)
from app.core.identity import Identity
from app.errors import BadInput, Conflict, NotPermitted
from app.gpu.fleet import Fleet
from app.gpu.simulated import SimulatedSource, parse_scenario
from app.service import Service
from app.service.door.server import ServiceServer
from tests.conftest import Clock
from tests.llama.tiny_gguf import write_tiny_gguf

MONDAY = 1795996800  # Mon 2026-11-30 00:00 UTC
NOW = MONDAY + 10 * 3600  # 10:00
TTL, DRAIN = 600, 30
ALICE = Identity("alice", 1001, False)
BOB = Identity("bob", 1002, False)
ME = pwd.getpwuid(os.geteuid())


class Board:
    """The service on its socket, with the test's clock; `client` speaks the wire as the gateway (this account)."""

    def __init__(self, root, store_url: str | None = None, *, preload: PreloadWindow | None = None,
                 projects: tuple[Project, ...] = ()) -> None:
        models = root / "models"
        models.mkdir(exist_ok=True)
        model = write_tiny_gguf(models / "tiny.gguf")
        binary = root / "llama-server"
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        self.clock = Clock(NOW)
        entry = CatalogModel(alias="team-llm", model=str(model), ctx=512, pool="prod", ttl_s=TTL, preload=preload,
                             project="search" if projects else None, klass="online", fallbacks=("other",))
        other = CatalogModel(alias="other", model=str(model), ctx=512, ttl_s=TTL)
        self.config = Config(
            db_path=root / "board.db", storage_url=store_url, policy=Policy(timezone="UTC"), pools=(Pool("prod", (2, 3)),),
            projects=projects, models=(entry, other), alerts=AlertSettings(enabled=False),
            llama=LlamaSettings(model_dirs=(str(models),), server_bin=str(binary), runner_user=ME.pw_name),
            gateway=GatewaySettings(user=ME.pw_name, drain_s=DRAIN),
            service=ServiceSettings(group=grp.getgrgid(os.getegid()).gr_name))  # the socket's group: any uid runs it
        source = SimulatedSource(parse_scenario({"cards": {"count": 4}}), clock=self.clock)
        self.service = Service(self.config, Fleet(source, 1.0, clock=self.clock), clock=self.clock, transport="socket")
        self.path = str(root / "board.sock")
        self.server = ServiceServer(self.service, self.path)
        self.listener = self.server.bind()
        self.accepting = threading.Thread(target=self._accept, daemon=True)
        self.accepting.start()
        self.clients: list = []
        self.runner: socket.socket | None = None
        self.client = self.connect()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed: the test is over
                return
            self.server._door(conn)

    def connect(self):
        from app.client.socket import SocketClient

        made = SocketClient(self.path, timeout=30)
        self.clients.append(made)
        return made

    def register_runner(self):
        """Register as the runner over the socket; the reader of the lines the service sends it."""
        self.runner, reader, answer = self.connect().stream("register", {"kind": "runner"})
        assert answer == {"runner": os.getpid()}
        assert self.service.wake_enforcer.wait(30)  # the registration sets it after its answer: then cleared, so
        self.service.wake_enforcer.clear()  # that a test sees who sets it next
        self.runner.settimeout(30)  # a start that never comes fails the test, not hangs it
        return reader

    def call(self, me: Identity, op: str, **args):
        return self.server.database.call(me, op, args).result()

    def enforce(self) -> dict:
        return self.server.database.submit(self.server.enforce_once).result()

    def on_demand(self) -> list[dict]:
        """Every on-demand booking, cancelled ones too."""
        return [b for b in self.client.call("all_bookings", since=0) if (b.get("request") or {}).get("on_demand")]

    def close(self) -> None:
        for client in self.clients:
            client.close()
        if self.runner is not None:
            self.runner.close()
        self.server.stopping.set()
        self.listener.close()
        self.server.database.shutdown()
        self.service.close()


@pytest.fixture
def make(tmp_path, store):
    """make(**kwargs): a Board on SQLite, or on a fresh PostgreSQL database."""
    made: list[Board] = []

    def board(**kwargs) -> Board:
        root = tmp_path / f"board{len(made)}"
        root.mkdir()
        made.append(Board(root, getattr(store, "url", None), **kwargs))
        return made[-1]

    yield board
    for board in made:
        board.close()


def test_concurrent_demands_make_one_booking_the_runners_on_the_pools_cards_and_start_it(make):
    """Eight demands at once over the socket: one booking, and every reply names it (starting, its cards, no
    message); it is the runner account's, for the catalog's class (and project: IMPLICIT "" here), on one card of
    pool prod, for ttl_s + drain_s from now, its request and note saying which alias; one plan on it with the entry's
    spec; the next enforcement pass sends the runner one start for it, under the alias.
    Wrong versions: the live booking not looked up (each demand books its own); the booking made as the caller (root)
    or with the member's default class; a count on any card (not the pool's); the lease without drain_s; the plan
    without the entry's ctx or alias; no start sent."""
    board = make()
    starts = board.register_runner()
    clients = [board.connect() for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda c: c.call("model_demand", alias="team-llm"), clients))
    [booking] = board.on_demand()
    assert replies == [{"alias": "team-llm", "state": "starting", "booking": booking["id"], "server": None,
                        "cards": booking["cards"], "message": None, "retry_after": None, "free_at": None}] * 8
    assert (booking["user"], booking["class"], booking.get("project", ""), booking["start"], booking["end"]) == (
        ME.pw_name, "online", "", NOW, NOW + TTL + DRAIN)
    assert len(booking["cards"]) == 1 and set(booking["cards"]) <= {2, 3}
    assert (booking["request"], booking["note"]) == ({"on_demand": "team-llm"}, "on demand: team-llm")
    assert board.service.wake_enforcer.is_set()  # its start need not wait for the next pass
    [plan] = board.call(Identity(ME.pw_name, ME.pw_uid, False), "serve_plans")
    assert (plan["booking"], plan["alias"], plan["ctx"], plan["user"]) == (booking["id"], "team-llm", 512, ME.pw_name)

    [started] = board.enforce()["planned_started"]
    told = json.loads(starts.readline())
    assert (told["event"], told["server"]["id"], told["server"]["booking_id"], told["server"]["alias"]) == (
        "start", started, booking["id"], "team-llm")
    again = board.client.call("model_demand", alias="team-llm")
    assert (again["state"], again["booking"], again["server"]) == ("starting", booking["id"], started)


def test_threads_in_one_process_waking_at_once_make_one_booking(make):
    """wake from eight threads of this process at once, each on its own connection (as in-process callers are, with
    no database thread to queue them): one booking. Wrong version: the decision not serialised (two threads each
    find none live and book both of the pool's cards)."""
    from app.service.rules.ondemand import wake

    board = make()
    board.register_runner()
    barrier = threading.Barrier(8)

    def demand(_):
        barrier.wait()
        try:
            return wake(board.service, "team-llm")["booking"]
        finally:
            board.service.close()  # this thread's connection

    with ThreadPoolExecutor(8) as pool:
        made = set(pool.map(demand, range(8)))
    assert len(made) == 1 and [b["id"] for b in board.on_demand()] == list(made)


def test_a_project_board_bills_the_catalogs_project(make):
    """On a board with [[projects]] the booking is for the entry's project, which the runner's account is no member
    of. Wrong version: the holder's own project chosen (refused: the runner is in none)."""
    board = make(projects=(Project(name="search", members=("alice",)),))
    board.register_runner()
    demand = board.client.call("model_demand", alias="team-llm")
    assert demand["state"] == "starting", demand
    [booking] = board.on_demand()
    assert booking["project"] == "search"


def test_nothing_free_is_unavailable_with_who_holds_the_cards_and_the_earliest_start_in_the_pool(make):
    """Pool prod's cards are alice's for 25 min (card 2) and bob's for 40 min (card 3); cards 0 and 1 are free but not
    the pool's: unavailable, nothing booked, the message naming who holds them and the earliest start (in 25 min:
    card 2 is free from then for ttl_s), free_at that start, retry_after the seconds to it.
    Wrong versions: a card outside the pool taken (or searched: free_at now); free_at at bob's end (the whole pool
    waited for); retry_after not the seconds to free_at (60, or capped at the wrong end)."""
    board = make()
    board.register_runner()
    board.call(ALICE, "book", cards=[2], start=NOW, end=NOW + 1500)
    board.call(BOB, "book", cards=[3], start=NOW, end=NOW + 2400)
    demand = board.client.call("model_demand", alias="team-llm")
    assert (demand["state"], demand["booking"], demand["cards"], demand["free_at"], demand["retry_after"]) == (
        "unavailable", None, [], NOW + 1500, 1500)
    message = demand["message"]
    assert message.startswith("team-llm needs 1 card of pool prod; none are free now ("), message
    assert "booked by alice until 10:25" in message and "booked by bob until 10:40" in message, message
    assert message.endswith("the earliest is 10:25 (in 25 min)"), message
    assert board.on_demand() == []


def test_a_project_past_its_budget_is_unavailable_in_the_budgets_words(make):
    """The catalog's project has 0.1 GPU-hours a month; ttl_s on one card needs 0.2 h: unavailable with the budget's
    refusal, no start found (free_at None, retry_after 60), nothing booked.
    Wrong versions: the budget passed over for the catalog's booking; its refusal worded as cards taken."""
    board = make(projects=(Project(name="search", members=("alice",), gpu_hours=0.1),))
    board.register_runner()
    demand = board.client.call("model_demand", alias="team-llm")
    assert (demand["state"], demand["free_at"], demand["retry_after"]) == ("unavailable", None, 60)
    assert demand["message"].startswith("team-llm needs 1 card of pool prod; project search's budget is 0.1"
                                        " GPU-hours a month: "), demand["message"]
    assert demand["message"].endswith("; no start within 30 days works"), demand["message"]
    assert board.on_demand() == []


def test_no_runner_registered_is_unavailable_and_books_nothing(make):
    """Wrong versions: booked anyway (the start would wait for a runner that may never come); the runner's check
    made only after booking."""
    board = make()
    demand = board.client.call("model_demand", alias="team-llm")
    assert (demand["state"], demand["booking"], demand["retry_after"], demand["free_at"]) == (
        "unavailable", None, 60, None)
    assert "no runner is registered" in demand["message"]
    assert board.client.call("all_bookings", since=0) == []


def test_an_alias_not_in_the_catalog_is_bad_input(make):
    board = make()
    board.register_runner()
    with pytest.raises(BadInput, match="^no model 'gpt-9' in the catalog"):
        board.client.call("model_demand", alias="gpt-9")


def test_touch_extends_the_lease_and_idle_lets_it_end(make):
    """Demanded at 10:00 (end 10:10:30); touched at 10:05 -> 10:15:30; not touched again: at 10:15:30 it is over,
    `models` says cold, and a demand books anew. A touch for an alias with no live booking, or not in the catalog,
    extends nothing and books nothing.
    Wrong versions: touch ignored; a touch's lease without drain_s, or from the booking's end rather than now
    (10:20:30); a touch that books a cold alias."""
    board = make()
    board.register_runner()
    first = board.client.call("model_demand", alias="team-llm")["booking"]
    board.clock.now = NOW + 300
    assert board.client.call("models_touch", aliases=["team-llm", "other", "gpt-9"]) == {
        "extended": {"team-llm": NOW + 300 + TTL + DRAIN}}
    assert board.client.call("get", id=first)["end"] == NOW + 300 + TTL + DRAIN
    assert [b["id"] for b in board.on_demand()] == [first]
    board.clock.now = NOW + 300 + TTL + DRAIN
    [shown] = [m for m in board.client.call("models") if m["alias"] == "team-llm"]
    assert (shown["state"], shown["booking"]) == ("cold", None)
    assert board.client.call("models_touch", aliases=["team-llm"]) == {"extended": {}}
    again = board.client.call("model_demand", alias="team-llm")["booking"]
    assert again != first


@pytest.mark.parametrize("at, woken", [(MONDAY + 19 * 3600 - 1, True), (MONDAY + 19 * 3600, False),
                                       (MONDAY + 9 * 3600, True), (MONDAY + 9 * 3600 - 1, False),
                                       (MONDAY - 86400 + 12 * 3600, False)])  # Sunday noon: not a window day
def test_a_preload_window_wakes_inside_and_not_outside(make, at, woken):
    """mon-fri 09:00-19:00: an enforcement pass inside it books the model with no request; at 19:00 (the window's
    end) and on a Sunday it does not. A pass a minute later touches it while still inside (its end grows), and leaves
    it to its lease once the window has closed.
    Wrong versions: the window's end minute counted in; its start left out; the days ignored; no touch inside, or
    one after the window."""
    board = make(preload=PreloadWindow(hours="09:00-19:00", days="mon-fri"))
    board.register_runner()
    board.clock.now = at
    board.enforce()
    made = board.on_demand()
    assert [b["request"]["on_demand"] for b in made] == (["team-llm"] if woken else [])
    if woken:
        board.clock.now = at + 60
        board.enforce()
        inside = at + 60 < MONDAY + 19 * 3600
        assert board.client.call("get", id=made[0]["id"])["end"] == (at + 60 if inside else at) + TTL + DRAIN


def test_models_shows_each_state_and_todays_use(make):
    """cold -> starting (booked, then its server starting) -> ready -> draining (within drain_s of its end) ->
    failed (its server crashed); last_used from the last touch, idle_s since; requests and tokens
    today from gateway_usage (yesterday's and another model's rows left out); catalog order; a member may read it.
    Wrong versions: ready while the server starts; draining missed (or from ttl_s); a failed start shown as
    starting (or a crash as ready); yesterday's requests counted; last_used from the usage rows while a touch is newer."""
    board = make()
    starts = board.register_runner()
    board.client.call("gateway_usage", records=[
        {"ts": NOW - 11 * 3600, "status": 200, "prompt_tokens": 5, "completion_tokens": 5, "duration_ms": 1,
         "model": "team-llm"},  # yesterday
        {"ts": NOW - 60, "status": 200, "prompt_tokens": 7, "completion_tokens": 3, "duration_ms": 1,
         "model": "team-llm"},
        {"ts": NOW - 30, "status": 200, "prompt_tokens": 1, "completion_tokens": 1, "duration_ms": 1,
         "model": "other"}])

    def shown() -> dict:
        [found] = [m for m in board.call(ALICE, "models") if m["alias"] == "team-llm"]
        return found

    cold = shown()
    assert [m["alias"] for m in board.call(ALICE, "models")] == ["team-llm", "other"]
    assert {k: cold[k] for k in ("state", "booking", "cards", "since", "last_used", "idle_s", "requests_today",
                                 "tokens_today", "cards_needed", "pool", "project", "class", "preloaded",
                                 "fallbacks")} == {
        "state": "cold", "booking": None, "cards": [], "since": None, "last_used": NOW - 60, "idle_s": 60,
        "requests_today": 1, "tokens_today": 10, "cards_needed": 1, "pool": "prod", "project": "", "class": "online",
        "preloaded": False, "fallbacks": ["other"]}
    booking = board.client.call("model_demand", alias="team-llm")["booking"]
    assert (shown()["state"], shown()["since"], shown()["last_used"]) == ("starting", NOW, NOW)
    [server] = board.enforce()["planned_started"]
    starts.readline()
    assert (shown()["state"], shown()["server"]) == ("starting", server)
    from app.llama import rows as servers
    from app.store.db import write

    with write(board.service.conn):  # the supervisor's report that it answers (it is another process)
        servers.transition(board.service.conn, server, ("starting",), "ready")
    board.clock.now = NOW + 120
    assert (shown()["state"], shown()["idle_s"]) == ("ready", 120)
    end = board.client.call("get", id=booking)["end"]
    board.clock.now = end - DRAIN - 1
    assert shown()["state"] == "ready"
    board.clock.now = end - DRAIN
    assert shown()["state"] == "draining"

    board.clock.now = NOW + 200
    board.client.call("models_touch", aliases=["team-llm"])
    with write(board.service.conn):
        servers.transition(board.service.conn, server, ("ready",), "crashed")
    assert (shown()["state"], shown()["last_used"]) == ("failed", NOW + 200)


def test_a_member_may_not_serve_or_plan_a_catalog_alias(make):
    """alice's serve plan (and serve start) under the catalog's alias: exit 3, the line; under another alias it is
    planned. Wrong versions: the check dropped; the runner's own plans refused too (test above starts one)."""
    board = make()
    booking = board.call(ALICE, "book", cards=[0], start=NOW, end=NOW + 3600)["id"]
    model = board.config.models[0].model
    line = "alias team-llm is the team catalog's ([[models]]): it is started on demand; give another --alias"
    for op in ("serve_plan", "serve_start"):
        with pytest.raises(Conflict) as refused:
            board.call(ALICE, op, booking=booking, model=model, alias="team-llm")
        assert (refused.value.exit_code, str(refused.value)) == (3, line)
    assert board.call(ALICE, "serve_plan", booking=booking, model=model, alias="alices")["alias"] == "alices"


@pytest.mark.parametrize("op, args", [("model_demand", {"alias": "team-llm"}),
                                      ("models_touch", {"aliases": ["team-llm"]})])
def test_a_member_may_not_demand_or_touch(make, op, args):
    """Only the gateway's account (or root): a member's demand would book cards as the runner, a touch keep them.
    Wrong versions: the check dropped, or made after the booking or the lease."""
    board = make()
    board.register_runner()
    if op == "models_touch":
        board.client.call("model_demand", alias="team-llm")
        board.clock.now = NOW + 300
    before = board.on_demand()
    with pytest.raises(NotPermitted) as refused:
        board.call(ALICE, op, **args)
    assert str(refused.value) == f"{op} is the gateway's own operation (account {ME.pw_name})"
    assert board.on_demand() == before


def test_gateway_state_says_which_servers_are_on_demand(make):
    """The runner starts alice's planned server and the catalog's; gateway_state names the catalog alias on the
    latter only. Wrong versions: the key left out, or set from the server's alias for every server."""
    board = make()
    starts = board.register_runner()
    booking = board.call(ALICE, "book", cards=[0], start=NOW, end=NOW + 3600)["id"]
    board.call(ALICE, "serve_plan", booking=booking, model=board.config.models[0].model, alias="alices")
    board.client.call("model_demand", alias="team-llm")
    assert len(board.enforce()["planned_started"]) == 2
    starts.readline(), starts.readline()
    servers = board.client.call("gateway_state")["servers"]
    assert sorted((s["alias"], s["user"], s["on_demand"]) for s in servers) == [
        ("alices", "alice", ""), ("team-llm", ME.pw_name, "team-llm")]


def test_a_lease_that_cannot_grow_is_left_to_end_and_the_next_demand_books_elsewhere(make):
    """alice books the on-demand card from 10:10:40, so its lease cannot pass 10:10:30 (her start less 10 s). A demand
    while more than drain_s is left answers with it; one with drain_s left (the gateway would stop routing to it
    now) books the pool's other card, and `models` then shows the new one.
    Wrong versions: the dying booking answered to the end (its boundary by one: 31 s left books anew, or 30 s
    does not); the new booking on the same card (refused: alice's) or outside the pool."""
    board = make()
    board.register_runner()
    first = board.client.call("model_demand", alias="team-llm")
    [card] = first["cards"]
    board.call(ALICE, "book", cards=[card], start=NOW + TTL + DRAIN + 10, end=NOW + 7200)
    board.clock.now = NOW + TTL - 1  # 31 s left
    assert board.client.call("model_demand", alias="team-llm")["booking"] == first["booking"]
    assert board.client.call("get", id=first["booking"])["end"] == NOW + TTL + DRAIN
    board.clock.now = NOW + TTL  # 30 s left: drain_s
    second = board.client.call("model_demand", alias="team-llm")
    assert second["booking"] != first["booking"] and second["cards"] == [{2: 3, 3: 2}[card]]
    [shown] = [m for m in board.client.call("models") if m["alias"] == "team-llm"]
    assert shown["booking"] == second["booking"]


def test_a_failed_start_is_unavailable_until_its_lease_runs_out(make):
    """The runner reports over its line that the start failed: the next demand is unavailable, naming the failure and
    when it is tried again (the booking's end, not extended), and `models` says failed; once the lease has run out a
    demand books afresh.
    Wrong versions: the failed booking answered as starting (the gateway would wait ready_timeout_s for nothing); its
    lease extended by the demand (never tried again while asked)."""
    board = make()
    starts = board.register_runner()
    first = board.client.call("model_demand", alias="team-llm")
    [server] = board.enforce()["planned_started"]
    starts.readline()
    changes = board.service.hub.subscribe({"servers"})
    board.runner.sendall(json.dumps({"event": "failed", "server": server, "reason": "out of memory"}).encode() + b"\n")
    assert changes.take(30)  # recorded: the servers changed
    board.clock.now = NOW + 60
    demand = board.client.call("model_demand", alias="team-llm")
    end = NOW + TTL + DRAIN
    assert (demand["state"], demand["booking"], demand["free_at"], demand["retry_after"]) == (
        "unavailable", None, end, end - NOW - 60)
    assert demand["message"] == (f"team-llm failed to start on cards {first['cards'][0]} (server {server} failed:"
                                 " out of memory); it is tried again 10:10 (in 10 min)")
    assert board.client.call("get", id=first["booking"])["end"] == end
    assert [m["state"] for m in board.client.call("models")] == ["failed", "cold"]
    board.clock.now = end
    assert board.client.call("model_demand", alias="team-llm")["booking"] not in (None, first["booking"])


def test_a_members_booking_over_the_on_demand_card_wins_and_the_next_demand_goes_elsewhere(make):
    """alice books the on-demand card from 10:02: the catalog's booking is cut to 10:01:50 (it yields), `models`
    shows it draining once drain_s is left, and a demand then books the pool's other card; with that one taken too
    (bob's), the demand after is unavailable until alice's booking ends.
    Wrong versions: the yield's end not honoured by the lease (a demand or touch growing it back over alice's);
    the draining booking answered; a card outside the pool taken."""
    board = make()
    board.register_runner()
    first = board.client.call("model_demand", alias="team-llm")
    [card] = first["cards"]
    other = {2: 3, 3: 2}[card]
    board.call(ALICE, "book", cards=[card], start=NOW + 120, end=NOW + 3600)
    assert board.client.call("get", id=first["booking"])["end"] == NOW + 110
    board.clock.now = NOW + 70
    assert board.client.call("models_touch", aliases=["team-llm"]) == {"extended": {"team-llm": NOW + 110}}
    board.clock.now = NOW + 80  # 30 s left: drain_s
    [shown] = [m for m in board.client.call("models") if m["alias"] == "team-llm"]
    assert (shown["state"], shown["booking"]) == ("draining", first["booking"])
    second = board.client.call("model_demand", alias="team-llm")
    assert second["state"] == "starting" and second["cards"] == [other]
    assert board.client.call("get", id=first["booking"])["end"] == NOW + 110
    board.call(ALICE, "book", cards=[other], start=NOW + 200, end=NOW + 3600)
    board.clock.now = NOW + 170  # the second cut to 10:03:10: 30 s left
    third = board.client.call("model_demand", alias="team-llm")
    assert (third["state"], third["free_at"]) == ("unavailable", NOW + 3600)

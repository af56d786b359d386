"""Planned servers on a real SQLite file (app.service.rules.plans, app.store.plans): a plan for a series covers each
occurrence in turn, each is due once at its start, the gateway's planned list, and who may plan what.
The runner starting one for real, as board-llama, is tests/llama/test_servers_service.py::TestPlannedServers."""

from __future__ import annotations

import json
import os
import pwd
import socket
import threading
from types import SimpleNamespace

import pytest

from app import wire
from app.config import Config, LlamaSettings, Policy
from app.core.identity import Identity
from app.errors import BadInput, NotPermitted
from app.service.rules import plans
from app.llama import rows as server_rows
from app.service.rules.series import SeriesService
from app.store import plans as plan_rows
from app.store.db import malformed_rows, write
from tests.conftest import FROZEN_NOW, sqlite_only  # Sunday 2026-11-29 15:30 UTC

MODELS = "/srv/models"
CONFIG = Config(policy=Policy(timezone="UTC", max_ahead_days=60), llama=LlamaSettings(model_dirs=(MODELS,)))
ALICE, BOB = Identity("alice", 1001, False), Identity("bob", 1002, False)


@pytest.fixture
def service(conn):
    """What plans.create needs of the service: its connection, config and clock (frozen, moved by the test)."""
    made = SimpleNamespace(conn=conn, config=CONFIG, now=FROZEN_NOW)
    made.clock = lambda: made.now
    return made


@pytest.fixture
def weekdays(make_service):
    """The seeds' team slot: cards 0-3, weekdays 09:00-19:00, for two weeks from Monday 2026-11-30."""
    return SeriesService(make_service(config=CONFIG)).book(
        cards=[0, 1, 2, 3], klass="online", every="weekday", start="9:00", until="19:00", first="2026-11-30",
        last="2026-12-11").booked


def test_a_series_plan_is_due_at_each_occurrences_start_once_and_planned_until_then(service, weekdays, conn):
    plan = plans.create(service, ALICE, booking=None, series=weekdays[0].series_id,
                        spec={"model": f"{MODELS}/qwen.gguf", "alias": "team", "parallel": 8})
    assert plan["next_start"] == weekdays[0].start and plan["next_booking"] == weekdays[0].id
    planned = plan_rows.planned_servers(conn, FROZEN_NOW)
    assert [p["booking"] for p in planned] == [b.id for b in weekdays] and len(planned) == 10
    assert planned[0] == {"alias": "team", "booking": weekdays[0].id, "start": weekdays[0].start,
                          "end": weekdays[0].end, "user": "alice"}
    assert plan_rows.due(conn, FROZEN_NOW) == []  # nothing before Monday 09:00
    monday, tuesday = weekdays[0], weekdays[1]
    [(due, booking)] = plan_rows.due(conn, monday.start)
    assert (due.id, booking, due.spec["parallel"], due.alias) == (plan["id"], monday.id, 8, "team")
    plan_rows.record_run(conn, due.id, monday.id, monday.start, server_id=None, error="no free port")
    assert plan_rows.due(conn, monday.start + 60) == []  # once per occurrence, even when it could not start
    assert plan_rows.due(conn, monday.end) == []  # over
    assert plan_rows.planned_servers(conn, monday.start + 60)[0]["booking"] == tuesday.id  # Monday's is gone
    assert [b for _, b in plan_rows.due(conn, tuesday.start)] == [tuesday.id]

    service.now = monday.start
    cancelled = plans.cancel(service, ALICE, plan["id"])
    assert cancelled["cancelled"] == monday.start and cancelled["next_start"] is None
    assert plan_rows.due(conn, tuesday.start) == [] and plan_rows.planned_servers(conn, monday.start) == []


def test_only_the_holder_plans_and_cancels_and_the_model_lies_in_model_dirs(service, weekdays, conn):
    monday = weekdays[0]
    with pytest.raises(NotPermitted, match="belongs to alice"):
        plans.create(service, BOB, booking=monday.id, series=None, spec={"model": f"{MODELS}/qwen.gguf"})
    with pytest.raises(BadInput, match=r"model_dirs \(/srv/models\)"):
        plans.create(service, ALICE, booking=monday.id, series=None, spec={"model": "/home/alice/../../srv/x.gguf"})
    with pytest.raises(BadInput, match="is set by board"):
        plans.create(service, ALICE, booking=monday.id, series=None,
                     spec={"model": f"{MODELS}/qwen.gguf", "extra": ["--api-key", "mine"]})
    plan = plans.create(service, ALICE, booking=monday.id, series=None, spec={"model": f"{MODELS}/sub/qwen.gguf"})
    assert plan["alias"] == "qwen" and plan["booking"] == monday.id
    with pytest.raises(NotPermitted):
        plans.cancel(service, BOB, plan["id"])
    assert plans.cancel(service, Identity("carol", 1003, True), plan["id"])["cancelled"] is not None  # an admin
    refusals = conn.execute("SELECT count(*) FROM events WHERE action LIKE 'server-plan%' AND ok = 0").fetchone()[0]
    assert refusals == 2


def test_a_plan_serves_its_bookings_project_and_project_may_name_only_that_one(service, weekdays, make_service, conn):
    """--project on serve plan: its booking's (or series') project, or exit 2 in one line, nothing written. Nearest
    wrong versions: --project ignored (a plan claiming another project), a board without projects taking any name."""
    from app.config import Project

    config = Config(policy=CONFIG.policy, llama=CONFIG.llama,
                    projects=(Project(name="A", members=("alice",)), Project(name="B", members=("alice",))))
    booking = make_service(config=config).create(cards=[5], start=FROZEN_NOW + 3600, end=FROZEN_NOW + 7200,
                                                 project="A")
    spec = {"model": f"{MODELS}/qwen.gguf"}
    plans_before = conn.execute("SELECT count(*) FROM server_plans").fetchone()
    with pytest.raises(BadInput) as refused:
        plans.create(service, ALICE, booking=booking.id, series=None, spec=spec, project="B")
    assert str(refused.value) == (f"booking {booking.id} is for project A, not 'B': a planned server serves its"
                                  " booking's project; leave out --project") and refused.value.exit_code == 2
    with pytest.raises(BadInput, match=rf"^series {weekdays[0].series_id} is for no project, not '\\x1b\[2J':"):
        plans.create(service, ALICE, booking=None, series=weekdays[0].series_id, spec=spec, project="\x1b[2J")
    assert conn.execute("SELECT count(*) FROM server_plans").fetchone() == plans_before
    assert plans.create(service, ALICE, booking=booking.id, series=None, spec=spec, project="A")["booking"] == booking.id
    assert plans.create(service, ALICE, booking=weekdays[1].id, series=None, spec=spec)["booking"] == weekdays[1].id


SPEC = {"parallel": 8, "model": f"{MODELS}/qwen.gguf", "alias": "team"}  # not in key order


def plan_for(conn, *, booking=None, series=None, user="alice", alias="team", now=FROZEN_NOW) -> int:
    with write(conn):
        return plan_rows.insert(conn, booking_id=booking, series_id=series, user=user,
                                uid={"alice": 1001, "bob": 1002}[user], alias=alias, spec=SPEC, now=now)


def test_the_store_keeps_a_plan_whole_lists_it_by_holder_and_cancels_it_once(conn, weekdays):
    monday = weekdays[0]
    bobs = plan_for(conn, booking=monday.id, user="bob", alias="solo")
    alices = plan_for(conn, series=monday.series_id, now=FROZEN_NOW + 60)
    stored = conn.execute("SELECT spec FROM server_plans WHERE id = ?", (alices,)).fetchone()[0]
    assert stored == '{"alias": "team", "model": "/srv/models/qwen.gguf", "parallel": 8}'  # canonical JSON
    assert plan_rows.get(conn, alices) == plan_rows.Plan(alices, None, monday.series_id, "alice", 1001, "team", SPEC,
                                                         FROZEN_NOW + 60)
    assert plan_rows.get(conn, alices + 1) is None
    assert [p.id for p in plan_rows.listing(conn)] == [bobs, alices]
    assert [(p.id, p.user, p.booking_id) for p in plan_rows.listing(conn, user="bob")] == [(bobs, "bob", monday.id)]
    with write(conn):
        assert plan_rows.cancel(conn, alices, FROZEN_NOW + 120) is True
        assert plan_rows.cancel(conn, alices, FROZEN_NOW + 180) is False  # once: the first time stays
    assert [p.id for p in plan_rows.listing(conn)] == [bobs]
    assert [(p.id, p.cancelled_at) for p in plan_rows.listing(conn, cancelled=True)] == [
        (bobs, None), (alices, FROZEN_NOW + 120)]
    assert plan_rows.listing(conn, user="alice") == []
    assert [p.id for p in plan_rows.listing(conn, user="alice", cancelled=True)] == [alices]


def test_an_occurrence_stays_planned_while_its_server_starts_and_the_server_knows_its_plan(conn, weekdays):
    monday, tuesday = weekdays[0], weekdays[1]
    friday = plan_for(conn, booking=weekdays[4].id, alias="friday")  # another plan, so ids of plans and bookings differ
    plan = plan_for(conn, series=monday.series_id)
    assert plan != monday.id
    assert plan_rows.upcoming(conn, FROZEN_NOW, plan_id=plan)[0] == {
        "plan": plan, "alias": "team", "booking": monday.id, "start": monday.start, "end": monday.end, "user": "alice"}
    assert [u["plan"] for u in plan_rows.upcoming(conn, FROZEN_NOW)[:6]] == [plan] * 4 + [friday, plan]
    with write(conn):
        started, members = (server_rows.insert(
            conn, booking_id=monday.id, user="alice", uid=1001, cards=[0], card_uuids=["GPU-0"], model=SPEC["model"],
            alias="team", host="127.0.0.1", port=port, ctx=None, parallel=8, split_mode=None, metrics=False,
            cmdline=[], now=monday.start) for port in (8001, 8002))
        plan_rows.record_run(conn, plan, monday.id, monday.start, server_id=started)
    assert plan_rows.plan_of_server(conn, started) == plan
    assert plan_rows.plan_of_server(conn, members) is None  # one a member started
    assert plan_rows.upcoming(conn, monday.start + 60, plan_id=plan)[0]["booking"] == monday.id  # still starting
    with write(conn):
        assert server_rows.transition(conn, started, ["starting"], "ready")
    assert plan_rows.upcoming(conn, monday.start + 60, plan_id=plan)[0]["booking"] == tuesday.id


@pytest.mark.parametrize(
    "column, value, problem",
    [
        ("user", b"al", "user is bytes b'al'"),  # TEXT columns store a number as text: a blob is what breaks them
        ("uid", "x", "uid is str 'x'"),
        ("alias", b"t", "alias is bytes b't'"),
        ("created_at", "soon", "created_at is str 'soon'"),
        ("spec", b"{}", "spec is bytes b'{}'"),
        ("spec", "[1]", "spec is JSON list, not an object"),
    ],
)
@sqlite_only  # hand edits of SQLite's loose types
def test_a_plan_edited_by_hand_is_reported_once_and_skipped_by_every_reader(conn, weekdays, column, value, problem):
    monday = weekdays[0]
    good = plan_for(conn, series=monday.series_id)
    bad = plan_for(conn, booking=monday.id)
    with write(conn):
        conn.execute(f"UPDATE server_plans SET {column} = ? WHERE id = ?", (value, bad))
    before = len(malformed_rows())
    assert plan_rows.get(conn, bad) is None
    assert [p.id for p in plan_rows.listing(conn)] == [good]
    assert [(p.id, booking) for p, booking in plan_rows.due(conn, monday.start)] == [(good, monday.id)]
    assert malformed_rows()[before:] == [
        f"server plan {bad} is malformed: {problem}; skipped (a hand edit? see board doctor)"]


def test_a_booking_given_to_another_holder_drops_its_old_holders_plans_only_when_forced(make_service, conn, weekdays):
    """A plan starts its server as its author (start_due): on a booking an admin gave to someone else it must not
    start (issue 31 §8). The reassign is refused (exit 3, what to do) while the old holder's plan waits; forced, the
    booking's own plan is cancelled and the series' plan skips this occurrence, nothing else. A plan the new holder
    wrote is theirs to keep."""
    from app.errors import Conflict

    monday, tuesday, wednesday = weekdays[0], weekdays[1], weekdays[2]
    own = plan_for(conn, booking=monday.id, alias="solo")
    series = plan_for(conn, series=monday.series_id)
    admin = make_service("root", 0, admin=True, config=CONFIG)
    admin.users = {"root": ("root", 0), "bob": ("bob", 1002)}.get  # the accounts here, bob among them
    with pytest.raises(Conflict) as refused:
        admin.reassign(monday.id, user="root")
    assert refused.value.exit_code == 3
    assert str(refused.value) == (f"booking {monday.id} has planned server {own} (alice), planned server {series}"
                                  f" (alice); cancel them first (board serve plan --cancel {own}), or pass --force to"
                                  " cancel them and give the booking to root")
    assert booking_holder(conn, monday.id) == "alice"
    assert [b for _, b in plan_rows.due(conn, monday.start)] == [monday.id, monday.id]

    given = admin.reassign(monday.id, user="root", force=True)
    assert (given.id, given.user) == (monday.id, "root")
    assert plan_rows.due(conn, monday.start) == []  # neither starts, as alice, on root's booking
    assert plan_rows.get(conn, own).cancelled_at == FROZEN_NOW
    assert [b for _, b in plan_rows.due(conn, tuesday.start)] == [tuesday.id]  # the series' plan goes on

    # bob's plan on a booking then given to bob is his own: kept, and not named; alice's series plan is
    bobs = plan_for(conn, booking=wednesday.id, user="bob", alias="bobs")
    with pytest.raises(Conflict, match=f"has planned server {series} \\(alice\\); cancel it first"):
        admin.reassign(wednesday.id, user="bob")
    assert admin.reassign(wednesday.id, user="bob", force=True).user == "bob"
    assert plan_rows.get(conn, bobs).cancelled_at is None
    assert [(p.id, b) for p, b in plan_rows.due(conn, wednesday.start)] == [(bobs, wednesday.id)]


def booking_holder(conn, booking_id: int) -> str:
    return conn.execute('SELECT "user" FROM bookings WHERE id = ?', (booking_id,)).fetchone()[0]


# -- a planned start that fails: in the service (start_due) or in the runner (app.cli.runner) -------------------


class Logged:
    """`logged`: the lines the service logged (the daemon_log fixture's reads), a list the test may clear."""

    def __init__(self, read) -> None:
        self.read, self._logged = read, []

    @property
    def logged(self) -> list[str]:
        self._logged += self.read().splitlines()
        return self._logged


class Pass(Logged):
    """The service's side of planned starts, on the test's store: start_due's passes, at a clock the test moves, with a
    real Runner whose connection is one end of a socketpair; `board runner`'s end is `self.runner_end`."""

    def __init__(self, conn, tmp_path, read) -> None:
        super().__init__(read)
        self.binary = tmp_path / "llama-server"
        self.binary.write_text("#!/bin/sh\n")
        self.binary.chmod(0o755)
        config = Config(policy=Policy(timezone="UTC", max_ahead_days=60),
                        llama=LlamaSettings(model_dirs=(MODELS,), server_bin=str(self.binary)))
        service_end, self.runner_end = socket.socketpair()
        for end in (service_end, self.runner_end):
            end.settimeout(10)  # a line that never comes fails the test, not hangs it
        self.from_service = self.runner_end.makefile("rb")
        self.supervisors: dict[int, object] = {}
        self.service = SimpleNamespace(conn=conn, config=config, now=FROZEN_NOW, fleet=None, host="",
                                       runner=plans.Runner(service_end, 4242),
                                       supervision=SimpleNamespace(get=self.supervisors.get, alive=lambda server: None,
                                                                  lines=lambda server: []),
                                       hub=SimpleNamespace(changed=lambda kind: None))
        self.service.clock = lambda: self.service.now
        self.server = SimpleNamespace(service=self.service, database=SimpleNamespace(
            submit=lambda fn: SimpleNamespace(result=fn)))  # the test's thread is the database thread

    def at(self, now: int) -> list[int]:
        self.service.now = now
        return plans.start_due(self.server)

    def told(self) -> dict:
        """The next instruction the runner reads."""
        return json.loads(self.from_service.readline())

    def nothing_told(self) -> bool:
        self.runner_end.setblocking(False)
        try:
            return self.runner_end.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return True
        finally:
            self.runner_end.settimeout(10)


@pytest.fixture
def passes(conn, tmp_path, daemon_log):
    made = Pass(conn, tmp_path, daemon_log)
    yield made
    made.from_service.close()
    made.runner_end.close()
    made.service.runner.conn.close()


def audit_rows(conn, *actions: str) -> list[tuple]:
    return conn.execute(f"SELECT actor, action, ok, booking_id, details FROM events WHERE action IN"
                        f" ({', '.join('?' * len(actions))}) ORDER BY id", actions).fetchall()


def test_a_refused_planned_start_is_recorded_once_and_the_next_occurrence_starts(conn, weekdays, passes):
    """Monday's start is refused (the service's llama-server binary is gone): the refusal is kept on Monday's run,
    audited and logged once, shown as the plan's `refused`; the later passes of Monday try nothing again and tell the
    runner nothing. Tuesday, the binary back, starts: a refusal is the occurrence's, not the plan's, and the plan
    shows no refusal once its latest start gave a server.
    Wrong versions: the refusal not recorded (tried, audited and logged again at every pass: a hot loop); recorded
    without its reason; audited as a success; kept as the plan's (Tuesday never starts, or still shows Monday's)."""
    monday, tuesday = weekdays[0], weekdays[1]
    plan = plans.create(passes.service, ALICE, booking=None, series=monday.series_id,
                        spec={"model": f"{MODELS}/qwen.gguf", "alias": "team"})["id"]
    passes.binary.unlink()
    assert passes.at(monday.start) == []
    for later in (60, 120, 3600):
        assert passes.at(monday.start + later) == []
    assert passes.nothing_told()
    run = conn.execute("SELECT booking_id, server_id, started_at, error FROM server_plan_runs").fetchall()
    assert len(run) == 1 and run[0][:3] == (monday.id, None, monday.start)
    assert run[0][3].startswith(f"config llama.server_bin names {passes.binary}, which is not an executable file")
    [(actor, action, ok, booking, details)] = audit_rows(conn, "server-plan-start", "server-start")
    assert (actor, action, ok, booking) == ("board-agent", "server-plan-start", 0, monday.id)
    assert json.loads(details) == {"plan": plan, "refused": run[0][3]}
    [logged] = passes.logged  # the whole reason in the service's log; the first 200 characters on the row
    assert logged.startswith(f"planned server {plan} for booking {monday.id}: not started: {run[0][3]}")
    shown = plans.plan_wire(passes.service, plan_rows.get(conn, plan))
    assert shown["refused"] == {"booking": monday.id, "error": run[0][3]}

    passes.binary.write_text("#!/bin/sh\n")
    passes.binary.chmod(0o755)
    [started] = passes.at(tuesday.start)
    told = passes.told()
    assert (told["event"], told["server"]["id"], told["server"]["booking_id"]) == ("start", started, tuesday.id)
    assert server_rows.get(conn, started).state == "starting" and passes.nothing_told()
    assert plans.plan_wire(passes.service, plan_rows.get(conn, plan))["refused"] is None
    assert [a[:4] for a in audit_rows(conn, "server-plan-start")] == [("board-agent", "server-plan-start", 0, monday.id)]


def test_a_start_the_runner_cannot_make_fails_its_server_once_and_is_not_sent_again(conn, weekdays, passes, tmp_path):
    """The runner cannot start Monday's server (its state directory is a file: no log can be written): it says so on
    its connection, and the service fails that server with the runner's reason, one `server-fail` row, and sends no
    second start at the next passes. The same report again, or one for a server the runner was not given (alice's own
    `serve start`, or a planned one whose supervisor has registered), changes nothing.
    Wrong versions: the runner keeps its failure to itself (the row waits in `starting`); the service takes a failure
    for any starting server (the runner could fail a member's own); or for one whose supervisor runs."""
    from app.cli import runner
    from app.llama.service import ServerService

    monday = weekdays[0]
    plans.create(passes.service, ALICE, booking=None, series=monday.series_id,
                 spec={"model": f"{MODELS}/qwen.gguf", "alias": "team"})
    [started] = passes.at(monday.start)
    told = passes.from_service.readline()
    (tmp_path / "state").write_text("a file where the runner's state directory should be")
    runner._handle(told, "/run/board/agent.sock", {"XDG_STATE_HOME": str(tmp_path / "state")}, passes.runner_end)
    said = passes.service.runner.conn.makefile("rb").readline()
    assert json.loads(said) == {"event": "failed", "server": started, "reason": (
        f"the runner: can't create the server log directory {tmp_path}/state/board/servers: Not a directory")}

    # alice's own server, started by her (no plan), on the same booking; and a second planned one, for Tuesday below
    own = ServerService(conn, ALICE, passes.service.config, clock=passes.service.clock).prepare(
        monday.id, model=f"{MODELS}/mine.gguf", alias="mine")
    for _ in range(2):  # the report arrives twice: the second finds the server failed already
        plans._runner_said(passes.server, said)
    plans._runner_said(passes.server, json.dumps({"event": "failed", "server": own.id, "reason": "forged"}).encode())
    failed = server_rows.get(conn, started)
    assert (failed.state, failed.reason) == ("failed", json.loads(said)["reason"])
    assert server_rows.get(conn, own.id).state == "starting"
    assert [a[:4] for a in audit_rows(conn, "server-fail")] == [("alice", "server-fail", 1, monday.id)]
    assert passes.at(monday.start + 60) == [] and passes.nothing_told()

    [tuesdays] = passes.at(weekdays[1].start)
    passes.told()
    passes.supervisors[tuesdays] = object()  # its supervisor registered: the runner did start it
    plans._runner_said(passes.server, json.dumps({"event": "failed", "server": tuesdays, "reason": "late"}).encode())
    assert server_rows.get(conn, tuesdays).state == "starting"


# -- `board runner` registers with the service (kind "runner"): the real service and its socket server, in process ----


class Agent(Logged):
    """A real Service and ServiceServer on tmp_path's store, its runner_user this process's own account; a client's
    registration goes to ServiceServer._register as _serve_connection hands it over, on a thread of its own, with the
    client's end of a socketpair for the test. Operations go through the server's database thread, as a client's do."""

    def __init__(self, tmp_path, store, read) -> None:
        super().__init__(read)
        from app.gpu import open_source
        from app.gpu.fleet import Fleet
        from app.service import Service
        from app.service.door.server import ServiceServer
        from tests.conftest import Clock

        self.user = pwd.getpwuid(os.geteuid())
        binary = tmp_path / "llama-server"
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        self.clock = Clock(FROZEN_NOW)
        self.config = Config(db_path=tmp_path / "board.db", storage_url=getattr(store, "url", None),
                             policy=Policy(timezone="UTC"),
                             llama=LlamaSettings(model_dirs=(MODELS,), server_bin=str(binary),
                                                 runner_user=self.user.pw_name))
        self.service = Service(self.config, Fleet(open_source(True, clock=self.clock), 1.0), clock=self.clock)
        self.server = ServiceServer(self.service, str(tmp_path / "agent.sock"))
        self.ends: list[socket.socket] = []
        self.threads: list[threading.Thread] = []

    def call(self, me: Identity, op: str, **args):
        return self.server.database.call(me, op, args).result()

    def register(self, request_id: int, *, uid: int, pid: int) -> tuple[threading.Thread, socket.socket, dict]:
        """A client of `uid` asks to register as the runner: its registration's thread, its end, the answer."""
        from app.service.conn.deadline import Lines
        from app.service.conn.peer import Peer

        service_end, client_end = socket.socketpair()
        self.ends += [service_end, client_end]
        service_end.settimeout(10)
        client_end.settimeout(10)  # an answer that never comes fails the test, not hangs it
        thread = threading.Thread(target=self.server._register, daemon=True, args=(
            service_end, Lines(service_end, line_s=10, limit=1 << 20), Peer(pid, uid, uid, frozenset()), request_id,
            {"kind": "runner"}))
        thread.start()
        self.threads.append(thread)
        return thread, client_end, json.loads(client_end.makefile("rb").readline())

    def close(self) -> None:
        for end in self.ends[1::2]:  # the clients go: each registration reads the end of its line and returns
            end.close()
        for thread in self.threads:
            thread.join(10)
        for end in self.ends[::2]:
            end.close()
        self.server.database.shutdown()
        self.service.close()


@pytest.fixture
def agent(tmp_path, store, daemon_log):
    made = Agent(tmp_path, store, daemon_log)
    yield made
    made.close()


def test_only_the_runner_user_registers_one_runner_at_a_time_and_its_reports_fail_only_its_starts(agent):
    """kind "runner": another uid is refused by name; the runner's uid registers (its pid answered, the enforcer woken,
    one log line), a second while it lives is refused; due plans go to its connection; its `failed` reports fail the
    planned starting server with the reason (200 characters at most) on the service's clock, and nothing else (not a
    report of another event, nor for a server given as true, nor an unknown server, which breaks nothing); when its
    line closes it is forgotten and another may register.
    Wrong versions: the uid check inverted or gone; a second runner taking over (or the first refused); the runner
    kept after its line closed, or never kept; reports ignored, or each taken as failed; a report for an unknown
    server ending the runner's line; the reason cut at 201; the failure stamped with the wall clock."""
    service = agent.service
    runner_uid, other_uid = agent.user.pw_uid, agent.user.pw_uid + 1
    thread, _, answer = agent.register(1, uid=other_uid, pid=4141)
    thread.join(10)
    assert answer == {"id": 1, "ok": False, "error": {
        "code": NotPermitted.exit_code, "message": f"only the user {agent.user.pw_name} runs planned servers"}}
    assert not thread.is_alive() and service.runner is None and agent.logged == []

    booking = agent.call(ALICE, "book", start=FROZEN_NOW + 3600, end=FROZEN_NOW + 7200, cards=[0])["id"]
    plan = agent.call(ALICE, "serve_plan", booking=booking, model=f"{MODELS}/qwen.gguf", alias="team")["id"]
    assert not service.wake_enforcer.is_set()
    first, runner_end, answer = agent.register(2, uid=runner_uid, pid=4242)
    assert answer == {"id": 2, "ok": True, "result": {"runner": 4242}}
    assert service.wake_enforcer.wait(10)  # set after the answer and the log line: a due start need not wait a pass
    assert agent.logged == ["board agent: runner registered (pid 4242)"]
    registered = service.runner
    second, _, answer = agent.register(3, uid=runner_uid, pid=4343)
    second.join(10)
    assert answer == {"id": 3, "ok": False, "error": {
        "code": NotPermitted.exit_code, "message": "a runner is registered already"}}
    assert not second.is_alive() and service.runner is registered and len(agent.logged) == 1

    agent.clock.now = FROZEN_NOW + 3600
    changed = service.hub.versions["servers"]
    [started] = agent.server.database.submit(plans.start_due, agent.server).result()
    told = json.loads(runner_end.makefile("rb").readline())
    assert (told["event"], told["server"]["id"], told["server"]["booking_id"]) == ("start", started, booking)
    assert service.hub.versions["servers"] == changed + 1

    agent.clock.now += 60  # before the reports: the registration's thread reads them as soon as they are sent
    for report in ({"event": "ready", "server": started, "reason": "not a failure"},
                   {"event": "failed", "server": True, "reason": "a bool is no server id"},
                   {"event": "failed", "server": started + 100, "reason": "no such server"},
                   {"event": "failed", "server": started, "reason": "x" * 300}):
        runner_end.sendall(wire.encode(report))
    runner_end.close()  # the runner goes: its registration reads the end of its line once it has read the reports
    first.join(10)
    assert not first.is_alive()
    failed = server_rows.get(agent.service.conn, started)
    assert (failed.state, failed.reason, failed.ended_at) == ("failed", "x" * 200, FROZEN_NOW + 3660)
    assert service.hub.versions["servers"] == changed + 2
    assert service.runner is None and registered.gone
    assert agent.logged[-1] == "board agent: runner (pid 4242) went away"
    assert plans.start_due(agent.server) == []  # no runner: nothing is tried, nothing recorded

    third, _, answer = agent.register(4, uid=runner_uid, pid=4343)
    assert answer == {"id": 4, "ok": True, "result": {"runner": 4343}} and service.runner.pid == 4343
    assert plan == plans.plan_wire(service, plan_rows.get(service.conn, plan))["id"]


# -- what serve plan refuses, and what it records ----------------------------------------------------------------

TWO_DIRS = Config(policy=Policy(timezone="UTC", max_ahead_days=60),
                  llama=LlamaSettings(model_dirs=(MODELS, "/opt/models/"), allowed_hosts=("127.0.0.1", "::1")))
FIT = {"per_card_mib": [900], "limit_mib": 24000, "fits": True, "forced": False}  # one figure: for one card


def plan_events(conn) -> list[tuple]:
    return [(actor, action, ok, booking, json.loads(details))
            for actor, action, ok, booking, details in audit_rows(conn, "server-plan", "server-plan-cancel")]


@pytest.mark.parametrize("config, booking, series, spec, refused", [
    (CONFIG, None, None, {"model": "/srv/models/q.gguf"}, "serve plan: give a booking or --series"),
    (CONFIG, "monday", "weekdays", {"model": "/srv/models/q.gguf"}, "serve plan: give a booking or --series"),
    (CONFIG, 9999, None, {"model": "/srv/models/q.gguf"}, "no booking 9999; 'board list --mine' shows your bookings"),
    (CONFIG, None, 9999, {"model": "/srv/models/q.gguf"}, "no series 9999; 'board series list' shows them"),
    (CONFIG, "monday", None, {"alias": "team"}, "serve plan: say which model: --model PATH.gguf"),
    (CONFIG, None, "weekdays", {"model": ""}, "serve plan: say which model: --model PATH.gguf"),
    (Config(), "monday", None, {"model": "/srv/models/q.gguf"},
     "a planned server's model must lie in [llama] model_dirs (none configured): the runner reads only those"),
    (TWO_DIRS, "monday", None, {"model": "/home/alice/q.gguf"},
     "a planned server's model must lie in [llama] model_dirs (/srv/models, /opt/models): the runner reads only those"),
    (TWO_DIRS, "monday", None, {"model": "/srv/models/q.gguf", "host": "0.0.0.0"},
     "host 0.0.0.0 is not allowed; the config allows 127.0.0.1, ::1"),
    (CONFIG, "monday", None, {"model": "/srv/models/q.gguf", "fit": FIT}, "serve_start: fit: 1 figures for 4 booked cards"),
    (CONFIG, None, "weekdays", {"model": "/srv/models/q.gguf", "fit": FIT},
     "serve_start: fit: 1 figures for 4 booked cards"),
    (CONFIG, None, "weekdays", {"model": "/srv/models/q.gguf", "fit": {**FIT, "fits": "yes"}},
     "serve_start: fit: fits is not true or false"),
], ids=["neither", "both", "no-booking", "no-series", "no-model", "empty-model", "no-model-dirs", "outside-model-dirs",
        "host", "booking-fit", "series-fit", "bad-fit"])
def test_a_plan_refused_says_why_in_one_line_and_records_nothing(service, weekdays, conn, config, booking, series, spec,
                                                                    refused):
    """Each refusal of create, as the member reads it: the booking or series missing, the model missing or outside
    model_dirs (each listed, or none), a host not allowed (the allowed listed), a fit whose figures are not one per
    booked card (the booking's, or the series' rule's).
    Wrong versions: another message or none; the host asked for ignored; the fit not checked, or checked against no
    card count; the dirs or hosts run together."""
    ids = {"monday": weekdays[0].id, "weekdays": weekdays[0].series_id}
    service.config = config
    with pytest.raises((BadInput, NotPermitted)) as error:
        plans.create(service, ALICE, booking=ids.get(booking, booking), series=ids.get(series, series), spec=spec)
    assert str(error.value) == refused
    assert plan_rows.listing(conn, cancelled=True) == [] and plan_events(conn) == []


def test_a_plan_on_a_booking_no_longer_booked_or_over_says_which(service, weekdays, conn, make_service):
    """Wrong versions: an ended booking called cancelled, or a cancelled one over."""
    monday, tuesday = weekdays[0], weekdays[1]
    make_service(config=CONFIG).cancel(tuesday.id)
    with pytest.raises(BadInput) as cancelled:
        plans.create(service, ALICE, booking=tuesday.id, series=None, spec={"model": f"{MODELS}/q.gguf"})
    assert str(cancelled.value) == f"booking {tuesday.id} is cancelled"
    service.now = monday.end
    with pytest.raises(BadInput) as over:
        plans.create(service, ALICE, booking=monday.id, series=None, spec={"model": f"{MODELS}/q.gguf"})
    assert str(over.value) == f"booking {monday.id} is over"


def test_a_plan_keeps_its_spec_as_checked_and_each_plan_and_refusal_is_audited(service, weekdays, conn, make_service):
    """A plan keeps the model's normal path, its alias (the model's name unless given), the extra arguments as checked
    (a file flag's path under model_dirs, each flag spelled as llama-server reads it), the host and fit asked for;
    plan_wire shows it whole, with its own next start. Each plan, refusal and cancel is one audit row: who, on which
    booking (none for a series), and why.
    Wrong versions: the model kept as typed; the alias or extra not kept; a file flag refused for want of model_dirs;
    the audit rows without their booking, details or action; plan_wire's keys or values mixed up, or another plan's
    next start shown."""
    monday, tuesday = weekdays[0], weekdays[1]
    service.config = TWO_DIRS
    fit = {**FIT, "per_card_mib": [900, 900, 900, 900]}
    mine = plans.create(service, ALICE, booking=tuesday.id, series=None, spec={
        "model": f"{MODELS}//sub/../qwen.gguf", "ctx": 8192, "parallel": 4, "host": "::1", "fit": fit, "metrics": None,
        "extra": ["--lora", f"{MODELS}/style.gguf", "--chat_template_file", f"{MODELS}/chat.jinja"]})
    assert plan_rows.get(conn, mine["id"]).spec == {
        "model": f"{MODELS}/qwen.gguf", "alias": "qwen", "ctx": 8192, "parallel": 4, "host": "::1", "fit": fit,
        "extra": ["--lora", f"{MODELS}/style.gguf", "--chat-template-file", f"{MODELS}/chat.jinja"]}  # as llama reads
    series = plans.create(service, ALICE, booking=None, series=monday.series_id,
                          spec={"model": f"{MODELS}/qwen.gguf", "alias": "qwen"})  # her own plan holds it: no clash
    assert plan_rows.get(conn, series["id"]).spec == {"model": f"{MODELS}/qwen.gguf", "alias": "qwen", "extra": []}
    assert mine == {"id": mine["id"], "booking": tuesday.id, "series": None, "user": "alice", "alias": "qwen",
                    "model": f"{MODELS}/qwen.gguf", "ctx": 8192, "parallel": 4, "created": FROZEN_NOW,
                    "cancelled": None, "next_start": tuesday.start, "next_booking": tuesday.id, "refused": None}
    assert (series["next_start"], series["next_booking"], series["ctx"], series["parallel"]) == (
        monday.start, monday.id, None, None)

    bobs = make_service("bob", 1002, config=CONFIG).create(cards=[4, 5, 6, 7], start=tuesday.start, end=tuesday.end).id
    with pytest.raises(NotPermitted) as booking_refused:
        plans.create(service, BOB, booking=tuesday.id, series=None, spec={"model": f"{MODELS}/qwen.gguf"})
    with pytest.raises(NotPermitted) as series_refused:
        plans.create(service, BOB, booking=None, series=monday.series_id, spec={"model": f"{MODELS}/qwen.gguf"})
    from app.errors import Conflict
    with pytest.raises(Conflict) as alias_refused:
        plans.create(service, BOB, booking=bobs, series=None, spec={"model": f"{MODELS}/qwen.gguf"})
    assert str(booking_refused.value) == f"booking {tuesday.id} belongs to alice"
    assert str(series_refused.value) == f"series {monday.series_id} belongs to alice"
    assert str(alias_refused.value).endswith(
        "the alias is the model's name unless you give one: pass --alias NAME")  # not one bob chose
    with pytest.raises(Conflict) as chosen_refused:
        plans.create(service, BOB, booking=bobs, series=None, spec={"model": f"{MODELS}/q.gguf", "alias": "qwen"})
    assert str(chosen_refused.value).endswith("; give another --alias")  # one he chose
    with pytest.raises(NotPermitted) as cancel_refused:
        plans.cancel(service, BOB, mine["id"])
    assert str(cancel_refused.value) == f"planned server {mine['id']} belongs to alice"
    with pytest.raises(BadInput) as no_plan:
        plans.cancel(service, ALICE, 9999)
    assert str(no_plan.value) == "no planned server 9999; 'board serve plan --list' shows them"
    service.now = FROZEN_NOW + 60
    assert plans.cancel(service, ALICE, mine["id"])["cancelled"] == FROZEN_NOW + 60

    assert plan_events(conn) == [
        ("alice", "server-plan", 1, tuesday.id,
         {"plan": mine["id"], "series": None, "model": f"{MODELS}/qwen.gguf", "alias": "qwen"}),
        ("alice", "server-plan", 1, None,
         {"plan": series["id"], "series": monday.series_id, "model": f"{MODELS}/qwen.gguf", "alias": "qwen"}),
        ("bob", "server-plan", 0, tuesday.id, {"refused": str(booking_refused.value)}),
        ("bob", "server-plan", 0, None, {"refused": str(series_refused.value)}),
        ("bob", "server-plan", 0, bobs, {"refused": str(alias_refused.value)}),
        ("bob", "server-plan", 0, bobs, {"refused": str(chosen_refused.value)}),
        ("bob", "server-plan", 0, tuesday.id, {"refused": str(cancel_refused.value)}),
        ("alice", "server-plan-cancel", 1, tuesday.id, {"plan": mine["id"]}),
    ]


def test_a_series_plan_clashes_only_over_its_occurrences_still_to_come(service, weekdays, conn, make_service):
    """The alias is checked over the series' booked occurrences that have not ended: not a cancelled one, not one
    that ends at this very second; but every other one. Wrong versions: a cancelled occurrence counted; one ending
    now counted; none counted."""
    from app.errors import Conflict

    monday, wednesday, friday = weekdays[0], weekdays[2], weekdays[-1]
    bob = make_service("bob", 1002, config=CONFIG)
    on_monday = bob.create(cards=[4, 5, 6, 7], start=monday.start, end=monday.end + 3600).id
    on_wednesday = bob.create(cards=[4, 5, 6, 7], start=wednesday.start, end=wednesday.end).id
    on_friday = bob.create(cards=[4, 5, 6, 7], start=friday.start, end=friday.end).id
    for booking, alias in ((on_monday, "team"), (on_wednesday, "team"), (on_friday, "busy")):
        plans.create(service, BOB, booking=booking, series=None, spec={"model": f"{MODELS}/q.gguf", "alias": alias})
    make_service(config=CONFIG).cancel(wednesday.id)
    service.now = monday.end  # Monday's occurrence ends now; bob's Monday booking goes on an hour
    with pytest.raises(Conflict, match=f"on booking {on_friday} from"):  # the series' last occurrence clashes
        plans.create(service, ALICE, booking=None, series=monday.series_id,
                     spec={"model": f"{MODELS}/q.gguf", "alias": "busy"})
    plan = plans.create(service, ALICE, booking=None, series=monday.series_id,
                        spec={"model": f"{MODELS}/q.gguf", "alias": "team"})
    assert plan["next_booking"] == weekdays[1].id


def test_a_due_start_goes_to_the_runner_with_its_grant_and_a_runner_gone_gets_no_more(conn, weekdays, passes):
    """Monday's start goes to the runner as the service's own would start it: its cards in the fleet's topology order
    (0 and 2 share a switch here), no log file of the service's (the supervisor's), the runner's grant; one log line.
    Tuesday the runner has stopped reading: both of Tuesday's starts are recorded, each logged as not sent, and the
    runner is gone, so Wednesday's pass tries nothing.
    Wrong versions: no topology (cards in index order); the rules in file mode (a log path); the grant's keys or
    values wrong; the send's result inverted or ignored; a runner that failed once still taken as there."""
    from app.gpu.model import LINK_MULTIPLE, Topology

    monday, tuesday, wednesday = weekdays[0], weekdays[1], weekdays[2]
    passes.service.fleet = SimpleNamespace(latest=lambda: SimpleNamespace(topology=Topology({(0, 2): LINK_MULTIPLE})))
    plan = plans.create(passes.service, ALICE, booking=None, series=monday.series_id,
                        spec={"model": f"{MODELS}/qwen.gguf", "alias": "team"})["id"]
    solo = plans.create(passes.service, ALICE, booking=tuesday.id, series=None,
                        spec={"model": f"{MODELS}/solo.gguf", "alias": "solo"})["id"]
    [started] = passes.at(monday.start)
    told = passes.told()
    assert (told["event"], told["server"]["id"], told["server"]["cards"]) == ("start", started, [0, 2, 1, 3])
    assert told["server"]["log_path"] == "" == server_rows.get(conn, started).log_path  # not yet: the supervisor says
    llama = passes.service.config.llama
    assert told["launch"] == {"ready_timeout_s": llama.ready_timeout_s, "db": None, "model_dirs": [MODELS]}
    assert passes.logged == [f"planned server {plan}: server {started} for booking {monday.id} (alice) sent to the runner"]

    passes.runner_end.shutdown(socket.SHUT_RD)  # the runner reads no more: a send fails
    passes.logged.clear()
    tuesdays = passes.at(tuesday.start)
    assert len(tuesdays) == 2 and passes.service.runner.gone
    assert passes.logged == [f"planned server {p}: the runner went away before server {s} could start"
                             for p, s in zip((plan, solo), tuesdays)]
    assert passes.at(wednesday.start) == []
    assert [b for _, b in plan_rows.due(conn, wednesday.start)] == [wednesday.id]  # left for the next runner


@sqlite_only  # a hand edit of SQLite's loose types
def test_a_series_whose_first_occurrence_was_edited_by_hand_is_planned_not_a_crash(service, weekdays, conn):
    """The host check reads the series' first occurrence; a row edited by hand reads as None (reported, skipped), and
    that None went on to refuse_remote: AttributeError, exit 1 "unexpected". Wrong versions this fails on: the unread
    None passed on (the crash), the plan refused for a row nobody can read."""
    monday = weekdays[0]
    with write(conn):
        conn.execute("UPDATE bookings SET request = '[1, 2]' WHERE id = ?", (monday.id,))
    plan = plans.create(service, ALICE, booking=None, series=monday.series_id,
                        spec={"model": f"{MODELS}/qwen.gguf", "alias": "team"})
    assert plan["series"] == monday.series_id and plan_rows.get(conn, plan["id"]) is not None

"""Planned servers on a real SQLite file (app.service.plans, app.store.plans): a plan for a series covers each
occurrence in turn, each is due once at its start, the gateway's planned list, and who may plan what.
The runner starting one for real, as board-llama, is tests/llama/test_servers_service.py::TestPlannedServers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.config import Config, LlamaSettings, Policy
from app.core.identity import Identity
from app.errors import BadInput, NotPermitted
from app.service import plans
from app.llama import rows as server_rows
from app.service.series import SeriesService
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

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
from app.service.series import SeriesService
from app.store import plans as plan_rows
from tests.conftest import FROZEN_NOW  # Sunday 2026-11-29 15:30 UTC

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

"""The gateway's keys, state and accounting through the service's operations, in process on a real SQLite file:
who may issue, list and revoke keys, what is stored (a hash, never the key), who may read gateway_state, and
how usage sums. The HTTP side is tests/llama/test_gateway.py; the admission rules tests/unit/test_gateway_routing.py."""

from __future__ import annotations

import sqlite3

import pytest

from app.config import Config
from app.core.identity import Identity
from app.core.keys import key_hash
from app.errors import BadInput, Conflict, NotPermitted
from app.gpu import open_source
from app.gpu.fleet import Fleet
from app.service import Service
from app.store.schema import LATEST
from tests.conftest import FROZEN_NOW

ALICE, BOB = Identity("alice", 1001, False), Identity("bob", 1002, False)
ADMIN, GATEWAY = Identity("carol", 1003, True), Identity("board-gateway", 990, False)


@pytest.fixture
def service(tmp_path, store):
    config = Config(db_path=tmp_path / "board.db", storage_url=getattr(store, "url", None))
    made = Service(config, Fleet(open_source(True, clock=lambda: FROZEN_NOW), 1.0), clock=lambda: FROZEN_NOW)
    yield made
    made.close()


def test_a_member_issues_their_own_key_and_only_its_hash_is_kept(service, tmp_path):
    made = service.call(ALICE, "key_new", {"name": "laptop", "models": ["team-llm"], "class": "online",
                                           "expires": FROZEN_NOW + 86400})
    assert made["user"] == "alice" and made["key"].startswith("bk-") and made["class"] == "online"
    assert made["models"] == ["team-llm"] and made["expires"] == FROZEN_NOW + 86400
    if service.config.storage_url:  # PostgreSQL: every text column of every key
        dump = "\n".join(str(row) for row in service.conn.execute("SELECT * FROM api_keys"))
    else:
        raw = sqlite3.connect(tmp_path / "board.db")
        assert raw.execute("PRAGMA user_version").fetchone()[0] == LATEST
        dump = "\n".join(raw.iterdump())
    assert made["key"] not in dump and made["key"][3:] not in dump and key_hash(made["key"]) in dump
    [listed] = service.call(ALICE, "key_list", {})
    assert "key" not in listed and "hash" not in listed and listed["fingerprint"] == made["fingerprint"]
    assert service.call(BOB, "key_list", {}) == []


def test_the_default_class_is_the_members_usual_one_else_batch(service):
    assert service.call(ALICE, "key_new", {})["class"] == "batch"
    with service.conn:
        for _ in range(2):
            service.conn.execute('INSERT INTO bookings ("user", uid, starts_at, ends_at, class, created_at, created_by)'
                                 " VALUES ('alice', 1001, 0, 10, 'online', 0, 1001)")
    assert service.call(ALICE, "key_new", {})["class"] == "online"


def test_keys_for_others_are_for_admins(service):
    with pytest.raises(NotPermitted):
        service.call(ALICE, "key_new", {"user": "root"})
    assert service.call(ADMIN, "key_new", {"user": "root"})["user"] == "root"
    with pytest.raises(BadInput):
        service.call(ADMIN, "key_new", {"user": "no-such-account-here"})


@pytest.mark.parametrize("args", [{"class": "gold"}, {"models": []}, {"models": [3]}, {"expires": FROZEN_NOW - 1},
                                  {"name": "x" * 101}])
def test_bad_keys_are_refused_and_nothing_is_written(service, args):
    with pytest.raises(BadInput):
        service.call(ALICE, "key_new", args)
    assert service.call(ALICE, "key_list", {"all": True}) == []


def test_revoke_is_the_holders_or_an_admins_and_the_gateway_hears_of_it(service):
    made = service.call(ALICE, "key_new", {})
    subscriber = service.hub.subscribe(["gateway"])
    with pytest.raises(BadInput):  # bob does not learn that alice's key exists
        service.call(BOB, "key_revoke", {"id": made["id"]})
    assert service.call(ALICE, "key_revoke", {"id": made["id"]})["revoked"] == FROZEN_NOW
    assert [e["event"] for e in subscriber.take(timeout=0)] == ["gateway"]
    with pytest.raises(Conflict):
        service.call(ADMIN, "key_revoke", {"id": made["id"]})
    assert service.call(ALICE, "key_list", {}) == []  # revoked keys show only with --all
    assert [k["id"] for k in service.call(ALICE, "key_list", {"all": True})] == [made["id"]]
    assert service.call(GATEWAY, "gateway_state", {})["keys"] == []


def test_gateway_state_and_usage_are_the_gateways_alone(service):
    made = service.call(BOB, "key_new", {"models": ["m"]})
    for who in (ALICE, ADMIN):
        with pytest.raises(NotPermitted):
            service.call(who, "gateway_state", {})
        with pytest.raises(NotPermitted):
            service.call(who, "gateway_usage", {"records": []})
    state = service.call(GATEWAY, "gateway_state", {})
    [key] = state["keys"]
    assert key["hash"] == key_hash(made["key"]) and key["models"] == ["m"] and key["user"] == "bob"
    assert state["servers"] == [] and state["planned"] == []


def test_usage_sums_by_user_key_and_model(service):
    a = service.call(ALICE, "key_new", {})
    b = service.call(BOB, "key_new", {})
    record = {"ts": FROZEN_NOW, "status": 200, "prompt_tokens": 10, "completion_tokens": 5, "duration_ms": 30}
    records = [{**record, "key_id": a["id"], "fingerprint": a["fingerprint"], "user": "alice", "model": "m1"},
               {**record, "key_id": a["id"], "fingerprint": a["fingerprint"], "user": "alice", "model": "m2"},
               {**record, "key_id": b["id"], "fingerprint": b["fingerprint"], "user": "bob", "model": "m1",
                "status": 503, "prompt_tokens": 0, "completion_tokens": 0},
               {**record, "ts": FROZEN_NOW - 100, "user": "bob", "model": "m1"}]
    assert service.call(GATEWAY, "gateway_usage", {"records": records}) == {"recorded": 4}
    by_user = service.call(ALICE, "usage", {"since": FROZEN_NOW - 10, "by": "user"})["rows"]
    assert by_user == [
        {"user": "alice", "key": a["fingerprint"], "model": "", "requests": 2, "prompt_tokens": 20,
         "completion_tokens": 10, "errors": 0},
        {"user": "bob", "key": b["fingerprint"], "model": "m1", "requests": 1, "prompt_tokens": 0,
         "completion_tokens": 0, "errors": 1}]
    by_model = service.call(ALICE, "usage", {"since": 0, "by": "model"})["rows"]
    assert [(r["model"], r["requests"], r["prompt_tokens"]) for r in by_model] == [("m1", 3, 20), ("m2", 1, 10)]
    with pytest.raises(BadInput):
        service.call(GATEWAY, "gateway_usage", {"records": [{**record, "status": "200"}]})


def test_the_report_gains_tokens_per_user(service):
    record = {"ts": FROZEN_NOW - 60, "status": 200, "prompt_tokens": 7, "completion_tokens": 3, "duration_ms": 1,
              "user": "alice", "model": "m"}
    service.call(GATEWAY, "gateway_usage", {"records": [record, record, {**record, "ts": FROZEN_NOW - 90000}]})
    doc = service.call(ALICE, "report", {"since_s": 86400})
    assert doc["tokens"] == [{"user": "alice", "requests": 2, "prompt_tokens": 14, "completion_tokens": 6}]
    from app.report.render import table

    assert "alice: 2 requests, 14 prompt and 6 completion tokens" in table(doc)

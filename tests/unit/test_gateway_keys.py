"""The gateway's keys, state and accounting through the service's operations, in process on a real SQLite file:
who may issue, list and revoke keys, what is stored (a hash, never the key), who may read gateway_state, and
how usage sums. The HTTP side is tests/llama/test_gateway.py; the admission rules tests/unit/test_gateway_routing.py."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest

from app.config import Config, Policy, Project
from app.core.identity import Identity
from app.core.keys import MAX_MODELS, class_rank, fingerprint, key_hash, new_key, parse_models
from app.errors import BadInput, Conflict, NotPermitted
from app.gpu import open_source
from app.gpu.fleet import Fleet
from app.service import Service
from app.store import keys as rows
from app.store.db import write
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


# -- the rules on each side of their boundaries (mutation testing, issue 19) ---------------------------------------


def test_a_key_is_32_random_bytes_its_hash_reads_any_header_and_its_fingerprint_is_8_hex_digits():
    made = new_key()
    assert made.startswith("bk-") and len(made) == 3 + 43 and made != new_key()  # 32 bytes in URL-safe base64
    # a header's bytes that are not UTF-8 reach the gateway as surrogates: they hash as the bytes that were sent
    assert key_hash("bk-\udcff") == hashlib.sha256(b"bk-\xff").hexdigest()
    assert fingerprint("0123456789abcdef" * 4) == "01234567"


def test_class_rank_is_classes_order_then_any_other_class_last():
    assert [class_rank(c) for c in ("online", "batch", "finetune", "experiment", None, "gold")] == [0, 1, 2, 3, 4, 4]


@pytest.mark.parametrize("text, models", [(None, None), ("", None), ("  ", None), ("a", ["a"]),
                                          (" a, b ,,c ", ["a", "b", "c"]), ("m" * 200, ["m" * 200]),
                                          (",".join(f"m{n}" for n in range(MAX_MODELS)),
                                           [f"m{n}" for n in range(MAX_MODELS)])])
def test_parse_models(text, models):
    assert parse_models(text) == models


@pytest.mark.parametrize("text, message", [
    (",".join(f"m{n}" for n in range(MAX_MODELS + 1)), "at most 64 models per key"),
    ("a," + "m" * 201, f"{'m' * 40!r} is not a model alias"),
    ("a\x1bb", "'a\\x1bb' is not a model alias")])
def test_parse_models_refuses(text, message):
    with pytest.raises(ValueError) as refused:
        parse_models(text)
    assert str(refused.value) == message


def add_key(conn, user="alice", uid=1001, hashed="h1", models=None, expires_at=None) -> int:
    with write(conn):
        return rows.insert(conn, name="k", user=user, uid=uid, hashed=hashed, fingerprint=hashed[:8], models=models,
                           klass="batch", now=FROZEN_NOW, created_by=uid, expires_at=expires_at)


def test_a_hand_edited_scope_opens_nothing_rather_than_everything(conn):
    key_id = add_key(conn, models=["m"])
    assert rows.get(conn, key_id)["models"] == ["m"]
    with write(conn):
        conn.execute("UPDATE api_keys SET models = '[not json' WHERE id = ?", (key_id,))
    assert rows.get(conn, key_id)["models"] == []
    assert rows.get(conn, key_id + 1) is None


def test_revoke_keeps_the_first_time_and_says_whether_it_revoked(conn):
    key_id = add_key(conn)
    with write(conn):
        assert rows.revoke(conn, key_id, FROZEN_NOW) is True
    with write(conn):
        assert rows.revoke(conn, key_id, FROZEN_NOW + 60) is False
    assert rows.get(conn, key_id)["revoked"] == FROZEN_NOW


def test_listing_without_filters_is_every_key_newest_first(conn):
    first = add_key(conn, hashed="h1")
    second = add_key(conn, user="bob", uid=1002, hashed="h2", expires_at=FROZEN_NOW)
    third = add_key(conn, hashed="h3")
    with write(conn):
        rows.revoke(conn, third, FROZEN_NOW)
    assert [k["id"] for k in rows.listing(conn)] == [third, second, first]
    assert [k["id"] for k in rows.listing(conn, uid=1001)] == [third, first]
    assert [k["id"] for k in rows.listing(conn, live_at=FROZEN_NOW - 1)] == [second, first]
    assert [k["id"] for k in rows.listing(conn, live_at=FROZEN_NOW)] == [first]  # bob's expires that second


def test_an_admin_lists_every_key_and_nobody_revokes_a_key_that_is_not_there(service):
    mine, theirs = service.call(ALICE, "key_new", {}), service.call(BOB, "key_new", {})
    service.call(BOB, "key_revoke", {"id": theirs["id"]})
    assert [k["id"] for k in service.call(ADMIN, "key_list", {"all": True})] == [theirs["id"], mine["id"]]
    with pytest.raises(BadInput):
        service.call(ADMIN, "key_revoke", {"id": theirs["id"] + 1})


def test_report_tokens_count_the_window_from_its_start_up_to_but_not_at_its_end(conn):
    record = {"status": 200, "prompt_tokens": 7, "completion_tokens": 3, "duration_ms": 1, "model": "m", "fingerprint": "f"}
    with write(conn):
        rows.record_usage(conn, [{**record, "ts": FROZEN_NOW - 100, "user": "alice"},
                                 {**record, "ts": FROZEN_NOW - 1, "user": "alice", "prompt_tokens": 1},
                                 {**record, "ts": FROZEN_NOW, "user": "alice"},
                                 {**record, "ts": FROZEN_NOW - 101, "user": "alice"},
                                 {**record, "ts": FROZEN_NOW - 50, "user": "bob", "status": 500, "prompt_tokens": 0,
                                  "completion_tokens": 0}])
    assert rows.tokens_by_user(conn, FROZEN_NOW - 100, FROZEN_NOW) == {"alice": (2, 8, 6), "bob": (1, 0, 0)}


# -- who may use a class, and how many keys a member holds (issue 31: bob made an online key, then 300 keys) --------

NOBODYS = "@board-tests-no-such-group"  # a group nobody is in: only the names listed may


def with_config(service, **changes):
    from msgspec.structs import replace

    service.config = replace(service.config, **changes)
    return service


def events_of(service, action: str) -> list[tuple]:
    """(actor, ok, details without the host that vouched for the actor) of each `action` event, oldest first."""
    import json

    return [(actor, bool(ok), {k: v for k, v in json.loads(details).items() if k != "host"})
            for actor, ok, details in service.conn.execute(
        "SELECT actor, ok, details FROM events WHERE action = ? ORDER BY id", (action,))]


def test_a_key_of_a_class_the_holder_may_not_use_is_refused_naming_who_may(service):
    with_config(service, classes={"online": (NOBODYS, "alice")})
    refusal = (f"bob may not use class online: it is for {NOBODYS}, alice ([classes] in the service's config);"
               " use batch or finetune or experiment")
    with pytest.raises(NotPermitted) as refused:
        service.call(BOB, "key_new", {"class": "online"})
    assert refused.value.exit_code == 4 and str(refused.value) == refusal
    with pytest.raises(NotPermitted, match="^bob may not use class online"):  # an admin's key for bob is still bob's
        service.call(ADMIN, "key_new", {"class": "online", "user": "bob"})
    assert service.call(ADMIN, "key_list", {"all": True}) == []
    assert [(actor, ok) for actor, ok, _ in events_of(service, "key_new")] == [("bob", False), ("carol", False)]
    assert events_of(service, "key_new")[0][2] == {"user": "bob", "why": refusal}
    assert service.call(ALICE, "key_new", {"class": "online"})["class"] == "online"  # named, she may
    # The admin is not named, but the holder is: the class is the holder's, whoever issues it.
    assert service.call(ADMIN, "key_new", {"class": "online", "user": "alice"})["class"] == "online"
    assert service.call(BOB, "key_new", {"class": "batch"})["class"] == "batch"  # a class not named: everyone


def test_a_key_made_before_its_class_was_kept_for_others_waits_after_every_class(service):
    made = service.call(BOB, "key_new", {"class": "online"})  # no [classes] yet: anyone may
    alices = service.call(ALICE, "key_new", {"class": "online"})
    with_config(service, classes={"online": ("alice",)})
    classes = {k["id"]: k["class"] for k in service.call(GATEWAY, "gateway_state", {})["keys"]}
    assert classes == {made["id"]: None, alices["id"]: "online"} and class_rank(None) == 4


def test_without_classes_every_member_may_use_every_class():
    from app.core.policy import class_refusal

    config = Config()
    assert config.classes == {}
    assert [class_refusal(config, k, "bob") for k in ("online", "batch", "finetune", "experiment")] == [None] * 4


def test_the_default_class_of_a_key_is_one_the_holder_may_use(service):
    with service.conn:
        for _ in range(2):
            service.conn.execute('INSERT INTO bookings ("user", uid, starts_at, ends_at, class, created_at, created_by)'
                                 " VALUES ('bob', 1002, 0, 10, 'online', 0, 1002)")
    assert service.call(BOB, "key_new", {})["class"] == "online"  # his usual, open to all
    with_config(service, classes={"online": ("alice",)})
    assert service.call(BOB, "key_new", {})["class"] == "batch"  # his usual is no longer his: batch
    with_config(service, classes={"online": ("alice",), "batch": ("alice",)})
    assert service.call(BOB, "key_new", {})["class"] == "experiment"  # then the lowest class he may use
    with_config(service, classes={k: ("alice",) for k in ("online", "batch", "finetune", "experiment")})
    with pytest.raises(NotPermitted, match=r"^bob may use no class \(\[classes\] in the service's config\)"):
        service.call(BOB, "key_new", {})
    assert service.call(ALICE, "key_new", {})["class"] == "batch"


def test_a_member_holds_at_most_max_keys_per_user_live_keys_of_their_own(service):
    assert service.config.gateway.max_keys_per_user == 20
    made = [service.call(BOB, "key_new", {}) for _ in range(20)]  # the 20th is accepted
    refusal = ("bob has 20 live keys, the most a member may hold ([gateway] max_keys_per_user); revoke one first"
               " (board key list, board key revoke ID)")
    with pytest.raises(NotPermitted) as refused:  # the 21st is not
        service.call(BOB, "key_new", {})
    assert refused.value.exit_code == 4 and str(refused.value) == refusal
    assert len(service.call(BOB, "key_list", {})) == 20 and events_of(service, "key_new")[-1] == (
        "bob", False, {"user": "bob", "why": refusal})
    assert service.call(ALICE, "key_new", {})["user"] == "alice"  # bob's keys are not alice's count
    service.call(BOB, "key_revoke", {"id": made[0]["id"]})  # a revoked key frees a place
    service.call(BOB, "key_new", {})
    with pytest.raises(NotPermitted):
        service.call(BOB, "key_new", {})
    with service.conn:  # an expired key frees one too
        service.conn.execute("UPDATE api_keys SET expires_at = ? WHERE id = ?", (FROZEN_NOW, made[1]["id"]))
    service.call(BOB, "key_new", {"expires": FROZEN_NOW + 1})  # live for a second yet: counted
    with pytest.raises(NotPermitted):
        service.call(BOB, "key_new", {})


def test_keys_an_admin_issues_for_an_account_are_apart_from_the_cap_and_an_admins_own_are_not(service):
    with_config(service, gateway=replace_gateway(service, max_keys_per_user=2))
    for _ in range(3):  # a service account's keys: the admin chose to, and each is audited
        assert service.call(ADMIN, "key_new", {"user": "bob"})["user"] == "bob"
    service.call(BOB, "key_new", {})
    service.call(BOB, "key_new", {})  # bob's own two: the three the admin issued do not count
    with pytest.raises(NotPermitted, match="^bob has 2 live keys"):
        service.call(BOB, "key_new", {})
    service.call(ADMIN, "key_new", {})
    service.call(ADMIN, "key_new", {"user": "carol"})  # naming herself is her own key
    with pytest.raises(NotPermitted, match="^carol has 2 live keys"):
        service.call(ADMIN, "key_new", {})


def replace_gateway(service, **changes):
    from msgspec.structs import replace

    return replace(service.config.gateway, **changes)


def test_a_record_sent_again_is_recorded_once_and_records_without_an_id_each(service):
    """The gateway sends a batch again when its reply was lost after the service committed it: each record's
    `request` id is recorded once. Records of a gateway that sends no id (before the ids) are each recorded.
    Wrong versions: the id not kept unique (counted twice); the second batch refused whole for its repeat (the new
    record in it lost); records without an id taken for one."""
    record = {"ts": FROZEN_NOW, "status": 200, "prompt_tokens": 10, "completion_tokens": 5, "duration_ms": 30,
              "user": "alice", "model": "m"}
    first = [{**record, "request": "b00t-1"}, {**record, "request": "b00t-2"}]
    service.call(GATEWAY, "gateway_usage", {"records": first})
    service.call(GATEWAY, "gateway_usage", {"records": [*first, {**record, "request": "b00t-3"}, record, record]})
    rows_now = service.conn.execute("SELECT request, prompt_tokens FROM gateway_usage ORDER BY id").fetchall()
    assert [tuple(r) for r in rows_now] == [("b00t-1", 10), ("b00t-2", 10), ("b00t-3", 10), (None, 10), (None, 10)]
    [total] = service.call(ALICE, "usage", {"since": 0, "by": "user"})["rows"]
    assert (total["requests"], total["prompt_tokens"]) == (5, 50)


@pytest.mark.parametrize("request_id, words", [
    ("x" * 65, "request is the gateway's id"), ("", "request is the gateway's id"),
    ("a\nb", "request is the gateway's id"), ("é", "request is the gateway's id"),
    (7, r"expected str \| null, got int at \$.records\[1\].request"),  # the type, at the door
])
def test_a_request_id_that_is_not_the_gateways_is_refused_and_nothing_is_written(service, request_id, words):
    """Wrong versions: no check (a member's text, or any length, in the table); the 64-character boundary moved."""
    record = {"ts": FROZEN_NOW, "status": 200, "prompt_tokens": 1, "completion_tokens": 1, "duration_ms": 1}
    with pytest.raises(BadInput, match=words):
        service.call(GATEWAY, "gateway_usage", {"records": [{**record, "request": "ok-1"},
                                                            {**record, "request": request_id}]})
    assert service.conn.execute("SELECT count(*) FROM gateway_usage").fetchone()[0] == 0
    service.call(GATEWAY, "gateway_usage", {"records": [{**record, "request": "y" * 64}]})
    assert service.conn.execute("SELECT request FROM gateway_usage").fetchone()[0] == "y" * 64


def test_a_key_without_a_class_takes_the_class_of_most_of_the_holders_bookings(service):
    """Two classes among alice's bookings, the less used one booked last: the key takes the one she books most.
    Wrong versions: the least used class (the order reversed); the latest booking's class; batch whatever she books."""
    for i, klass in enumerate(("online", "online", "online", "experiment", "experiment")):
        service.call(ALICE, "book", {"cards": [i], "start": FROZEN_NOW + 3600, "end": FROZEN_NOW + 7200,
                                     "class": klass})
    assert service.call(ALICE, "key_new", {})["class"] == "online"


@pytest.mark.parametrize("status, errors", [(399, 0), (400, 1), (503, 1)])
def test_a_request_answered_400_or_more_counts_as_an_error(service, status, errors):
    """Wrong versions: the boundary moved by one (a 400 not counted, or a 399 counted)."""
    record = {"ts": FROZEN_NOW, "status": status, "prompt_tokens": 1, "completion_tokens": 1, "duration_ms": 1,
              "user": "alice", "model": "m"}
    service.call(GATEWAY, "gateway_usage", {"records": [record]})
    [row] = service.call(ALICE, "usage", {"since": 0, "by": "user"})["rows"]
    assert row["errors"] == errors


@pytest.mark.parametrize("ahead, made", [(0, False), (1, True)], ids=["expires-now", "a-second-ahead"])
def test_a_key_that_would_expire_as_it_is_made_is_refused(service, ahead, made):
    """Wrong version: a key expiring this very second made (<= moved to <): dead on arrival, and counted against the
    cap until then."""
    if made:
        assert service.call(ALICE, "key_new", {"expires": FROZEN_NOW + ahead})["expires"] == FROZEN_NOW + ahead
    else:
        with pytest.raises(BadInput, match="^the key would expire before it is made; give a time in the future$"):
            service.call(ALICE, "key_new", {"expires": FROZEN_NOW + ahead})
        assert service.call(ALICE, "key_list", {"all": True}) == []


def test_root_may_read_what_the_gateway_reads_and_uid_1_is_refused_in_words(service):
    """root (uid 0) passes the gateway's check as the gateway's own account does; any other account is refused
    naming the operation and the gateway's account.
    Wrong versions: the root test on another uid (root refused, uid 1 let in); the refusal without its words."""
    assert service.call(Identity("root", 0, False), "gateway_state", {})["keys"] == []
    daemon = Identity("daemon", 1, False)
    with pytest.raises(NotPermitted) as refused:
        service.call(daemon, "gateway_state", {})
    assert str(refused.value) == "gateway_state is the gateway's own operation (account board-gateway)"
    with pytest.raises(NotPermitted) as refused:
        service.call(daemon, "gateway_usage", {"records": []})
    assert str(refused.value) == "gateway_usage is the gateway's own operation (account board-gateway)"


def test_a_refused_keys_audit_names_its_holder_by_the_first_64_characters(service):
    """The audit row of a refused key keeps the holder's name cut to 64 characters, as the not-an-admin refusal does.
    Wrong version: another cut."""
    with_config(service, gateway=replace_gateway(service, max_keys_per_user=0))
    long = Identity("m" * 80, 1004, False)
    with pytest.raises(NotPermitted):
        service.call(long, "key_new", {})
    assert events_of(service, "key_new")[-1][2]["user"] == "m" * 64


PROJECTS = (Project(name="A", members=("alice", "bob", "root"), classes=("online", "batch"), tokens_per_day=1000),
            Project(name="B", members=("bob", "@no-such-group-here"), classes=("experiment",)))


@pytest.fixture
def projects(tmp_path, store):
    """A service whose config has projects A (alice, bob, root; online and batch) and B (bob; experiment only),
    its day the UTC day (FROZEN_NOW is 15:30 UTC)."""
    config = Config(db_path=tmp_path / "board.db", storage_url=getattr(store, "url", None), projects=PROJECTS,
                    policy=Policy(timezone="UTC"))
    made = Service(config, Fleet(open_source(True, clock=lambda: FROZEN_NOW), 1.0), clock=lambda: FROZEN_NOW)
    yield made
    made.close()


class TestKeysOfProjects:
    def test_a_key_is_for_the_members_only_project_or_the_one_they_name_and_lists_with_it(self, projects):
        """alice (A only) needs no --project; bob (A and B) names one, and its class is one B may use; an admin's
        key for an account is the account's project. The key's project is in key_new's reply, key_list and
        gateway_state.
        Wrong versions: the project not written (key_list without it), the admin's project taken for the
        account's, the default class one the project may not use (bob's B key defaulting to batch)."""
        alice = projects.call(ALICE, "key_new", {})
        assert (alice["project"], alice["class"]) == ("A", "batch")
        bobs = projects.call(BOB, "key_new", {"project": "B"})
        assert (bobs["project"], bobs["class"]) == ("B", "experiment")
        roots = projects.call(ADMIN, "key_new", {"user": "root"})
        assert roots["project"] == "A"
        assert [(k["user"], k["project"]) for k in projects.call(ADMIN, "key_list", {"all": True})] == [
            ("root", "A"), ("bob", "B"), ("alice", "A")]
        state = projects.call(GATEWAY, "gateway_state", {})
        assert {k["user"]: k["project"] for k in state["keys"]} == {"alice": "A", "bob": "B", "root": "A"}

    @pytest.mark.parametrize("who, args, error, says", [
        (ALICE, {"project": "B"}, NotPermitted, "alice is not a member of project B (members: bob,"
                                                " @no-such-group-here); their projects: A"),
        (BOB, {"project": "B", "class": "online"}, NotPermitted,
         "project B may not use class online (project A may); its classes are experiment"),
        (BOB, {}, BadInput, "bob is in projects A, B; pick one with --project"),
        (ALICE, {"project": "C"}, BadInput, "no project 'C'; the projects are A, B ('board projects' shows them)"),
        (ADMIN, {"user": "root", "project": "B"}, NotPermitted, "root is not a member of project B"),
    ])
    def test_a_key_for_a_project_one_is_not_in_or_a_class_it_may_not_use_is_refused_and_nothing_written(
            self, projects, who, args, error, says):
        """Refused, one line naming what and who may; nothing written.
        Wrong versions: no membership check (alice's key for B made), the project's classes not checked, an admin's
        own membership checked instead of the account's."""
        with pytest.raises(error) as refused:
            projects.call(who, "key_new", args)
        assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
        assert projects.conn.execute("SELECT COUNT(*) FROM api_keys").fetchone()[0] == 0

    def test_usage_records_carry_their_project_and_the_gateway_is_told_todays_tokens_per_project(self, projects):
        """gateway_usage stores each record's project; gateway_state's tokens_today sums prompt and completion
        tokens per project since the policy zone's midnight (15:30 UTC: 15.5 h back), a record at 23:59 yesterday
        left out.
        Wrong versions: the project dropped (all under ""), yesterday's records counted, completion tokens left out."""
        record = {"ts": FROZEN_NOW - 60, "status": 200, "prompt_tokens": 10, "completion_tokens": 5, "duration_ms": 1}
        midnight = FROZEN_NOW - 15 * 3600 - 1800
        projects.call(GATEWAY, "gateway_usage", {"records": [
            {**record, "project": "A"}, {**record, "project": "A", "ts": midnight},
            {**record, "project": "A", "ts": midnight - 1}, {**record, "project": "B", "prompt_tokens": 1}, record]})
        assert [r[0] for r in projects.conn.execute("SELECT project FROM gateway_usage ORDER BY id")] == [
            "A", "A", "A", "B", ""]
        assert projects.call(GATEWAY, "gateway_state", {})["tokens_today"] == {
            "since": midnight, "projects": {"A": 30, "B": 6, "": 15}}


    def test_a_starting_gateway_is_told_each_projects_past_tokens_decayed_hour_by_hour(self, projects):
        """fair_use (asked once, as the gateway starts): each project's recorded tokens, each hour's decayed from its
        middle to now by the half-life (7 days). A's 1,000 a week ago count 500, its 200 this hour (its middle is
        now) 200; B's 100 from 71 days ago are past the lookback (10 half-lives). Not asked: not read.
        Wrong versions: no decay (A 1200), decayed from the hour's start (a week and 30 min: 498.6), the lookback
        ignored (B 0.09), read on every state (fair_use without asking)."""
        week = 7 * 86400
        record = {"status": 200, "completion_tokens": 0, "duration_ms": 1}
        projects.call(GATEWAY, "gateway_usage", {"records": [
            {**record, "ts": FROZEN_NOW - week, "prompt_tokens": 1000, "project": "A"},
            {**record, "ts": FROZEN_NOW - 60, "prompt_tokens": 200, "project": "A"},
            {**record, "ts": FROZEN_NOW - 71 * 86400, "prompt_tokens": 100, "project": "B"}]})
        assert "fair_use" not in projects.call(GATEWAY, "gateway_state", {})
        assert projects.call(GATEWAY, "gateway_state", {"fair_use": True})["fair_use"] == {"A": 700.0}


def test_a_board_without_projects_keeps_its_key_shapes_and_refuses_a_project(service):
    """No [[projects]]: key_new's reply and key_list carry no "project"; --project is bad input; gateway_state's
    tokens_today names no project.
    Wrong versions: "project": "" on the wire (a changed shape), --project accepted and ignored."""
    made = service.call(ALICE, "key_new", {})
    assert "project" not in made and "project" not in service.call(ALICE, "key_list", {})[0]
    with pytest.raises(BadInput, match="this board has no projects, so there is no project 'A'; leave out --project"):
        service.call(ALICE, "key_new", {"project": "A"})
    assert service.call(GATEWAY, "gateway_state", {})["tokens_today"]["projects"] == {}
    assert "fair_use" not in service.call(GATEWAY, "gateway_state", {"fair_use": True})

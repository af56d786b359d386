"""The gateway's admission rules (app.gateway.routing), on its own event loop, without HTTP: least outstanding,
the drain before a booking ends, class order then round-robin across members then first come when slots are full,
the per-member cap, and the refusals a client sees (401, 403, 404, 503 with Retry-After for planned or draining models, 429)."""

from __future__ import annotations

import asyncio

import pytest

from app.core.keys import key_hash
from app.gateway.routing import Refused, Router

NOW = 1_800_000_000.0


def server(id_, alias="m", parallel=1, end=NOW + 3600, state="ready"):
    return {"id": id_, "alias": alias, "url": f"http://127.0.0.1:{9000 + id_}", "api_key": None, "parallel": parallel,
            "user": "alice", "booking": 40 + id_, "booking_end": end, "cards": [id_], "state": state, "host": "local"}


def key(id_, klass="batch", models=None, expires=None, user=None):
    return {"id": id_, "hash": key_hash(f"k{id_}"), "user": user or f"u{id_}", "models": models, "class": klass,
            "expires": expires, "revoked": None, "fingerprint": f"fp{id_}"}


async def settle():
    """Let every task run until none can go further (a woken waiter takes a few turns of the loop)."""
    for _ in range(20):
        await asyncio.sleep(0)


def router(servers, keys=(), planned=(), queue_timeout_s=5.0, max_per_user=8, drain_s=30.0):
    made = Router(drain_s, queue_timeout_s, max_per_user, lambda: NOW)
    made.update({"servers": list(servers), "keys": list(keys), "planned": list(planned)})
    return made


async def test_least_outstanding_spreads_one_alias_over_its_servers():
    r = router([server(1, parallel=2), server(2, parallel=2)])
    k = key(1)
    picked = [await r.admit("m", k) for _ in range(4)]
    assert sorted(s.id for s in picked) == [1, 1, 2, 2]
    r.release(picked[0], k)
    assert (await r.admit("m", k)).id == picked[0].id  # the one with a free slot


async def test_full_slots_admit_online_before_batch_then_first_come():
    r = router([server(1)], queue_timeout_s=30)
    first = await r.admit("m", key(1))
    order = []
    held = key(1)

    async def wait(k):
        order.append((k["id"], (await r.admit("m", k)).id))

    tasks = [asyncio.create_task(wait(k)) for k in (key(2, "batch"), key(3, "experiment"), key(4, "online"),
                                                   key(5, "online"))]
    await settle()
    assert order == [] and r.waiting() == 4
    for n, expected in enumerate((4, 5, 2, 3), 1):
        r.release(r.servers[1], held)
        held = key(expected)
        await settle()
        assert len(order) == n and order[-1][0] == expected
    await asyncio.gather(*tasks)
    assert first.outstanding == 1


async def test_a_wait_past_queue_timeout_is_429_with_retry_after_and_gives_no_slot_away():
    r = router([server(1)], queue_timeout_s=0.05)
    await r.admit("m", key(1))
    with pytest.raises(Refused) as refused:
        await r.admit("m", key(2))
    assert refused.value.status == 429 and refused.value.retry_after >= 1 and "busy" in refused.value.message
    assert r.servers[1].outstanding == 1 and r.waiting() == 0 and 2 not in r.in_flight


async def test_a_client_that_leaves_the_queue_is_forgotten():
    r = router([server(1)], queue_timeout_s=30)
    held = await r.admit("m", key(1))
    waiting = asyncio.create_task(r.admit("m", key(2)))
    await settle()
    waiting.cancel()
    await settle()
    r.release(held, key(1))
    assert r.servers[1].outstanding == 0 and r.waiting() == 0 and r.in_flight == {}


async def test_the_per_member_cap_counts_every_key_of_theirs():
    r = router([server(1, parallel=8)], max_per_user=2)
    await r.admit("m", key(1, user="bob"))
    await r.admit("m", key(2, user="bob"))
    with pytest.raises(Refused) as refused:
        await r.admit("m", key(3, user="bob"))  # a third key of bob's is still bob
    assert refused.value.status == 429 and "max_concurrent_per_user" in refused.value.message
    assert (await r.admit("m", key(4, user="carol"))).id == 1  # another member is not held back


async def test_a_server_whose_booking_ends_within_drain_s_gets_no_new_requests():
    r = router([server(1, end=NOW + 10), server(2, end=NOW + 3600)])
    assert {(await r.admit("m", key(1))).id for _ in range(1)} == {2}
    alone = router([server(1, end=NOW + 10)])
    with pytest.raises(Refused) as refused:
        await alone.admit("m", key(1))
    assert refused.value.status == 503 and refused.value.retry_after == 30


async def test_planned_unknown_and_unready_models():
    planned = [{"alias": "team", "booking": 42, "start": NOW + 600, "end": NOW + 4200, "user": "alice"}]
    r = router([server(1, alias="m"), server(2, alias="starting", state="starting")], planned=planned)
    with pytest.raises(Refused) as refused:
        await r.admit("team", key(1))
    assert refused.value.status == 503 and refused.value.retry_after == 600
    assert "served from" in refused.value.message and "(booking 42)" in refused.value.message
    with pytest.raises(Refused) as refused:
        await r.admit("starting", key(1))
    assert refused.value.status == 404 and "served now: m" in refused.value.message


def test_keys_unknown_expired_revoked_and_out_of_scope():
    r = router([server(1)], keys=[key(1, models=["m"]), key(2, expires=NOW - 1), {**key(3), "revoked": NOW - 5}])
    assert r.authorise(key_hash("k1"), "m")["id"] == 1
    for hashed in (None, key_hash("nope"), key_hash("k2"), key_hash("k3")):
        with pytest.raises(Refused) as refused:
            r.authorise(hashed, "m")
        assert refused.value.status == 401
    with pytest.raises(Refused) as refused:
        r.authorise(key_hash("k1"), "other")
    assert refused.value.status == 403 and "fp1" in refused.value.message


async def test_a_new_state_keeps_the_requests_in_flight_counted():
    r = router([server(1)])
    held = await r.admit("m", key(1))
    r.update({"servers": [server(1), server(2)], "keys": [], "planned": []})
    assert r.servers[1].outstanding == 1 and held.outstanding == 1
    assert (await r.admit("m", key(1))).id == 2


async def test_a_request_admitted_before_a_new_state_frees_its_slot_in_the_new_one():
    # CI saw this: requests in flight while the state changed kept their server's slots busy for good, and the next
    # requests waited out the queue (429) with the servers idle.
    r = router([server(1)])
    held = await r.admit("m", key(1))
    r.update({"servers": [server(1)], "keys": [], "planned": []})
    waiting = asyncio.create_task(r.admit("m", key(2)))
    await settle()
    assert not waiting.done()
    r.update({"servers": [server(1)], "keys": [], "planned": []})
    r.release(held, key(1))
    await settle()
    assert waiting.done() and waiting.result().id == 1
    r.release(waiting.result(), key(2))
    assert r.servers[1].outstanding == 0


# -- each rule on both sides of its boundary, and every refusal as a client gets it (mutation testing, issue 19) --

LONG = "x" * 90  # a model name past the 80 characters a refusal quotes


def seen(error: Refused) -> tuple:
    """A refusal as the client gets it: status, error type, code, Retry-After and the line to act on."""
    assert str(error) == error.message  # what a log line shows
    return error.status, error.kind, error.code, error.retry_after, error.message


def refused(call) -> tuple:
    with pytest.raises(Refused) as caught:
        call()
    return seen(caught.value)


async def refused_admit(r, model, k) -> tuple:
    with pytest.raises(Refused) as caught:
        await r.admit(model, k)
    return seen(caught.value)


def local_time(ts: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(ts).astimezone().strftime("%a %H:%M")


async def test_before_the_first_state_every_request_waits_for_the_service_and_after_an_empty_one_none_is_served():
    r = Router(30.0, 5.0, 8, lambda: NOW)
    assert refused(lambda: r.authorise(key_hash("k1"), "m")) == (
        503, "server_error", "service_unavailable", 5,
        "the gateway has not reached the board service yet; try again in a few seconds")
    none_served = (404, "invalid_request_error", "model_not_found", None, "no server serves 'm'; served now: none")
    assert await refused_admit(r, "m", key(1)) == none_served
    r.update({})  # a state that lists nothing: no server, no plan, no key
    assert refused(lambda: r.authorise(key_hash("k1"), "m"))[:3] == (401, "invalid_request_error", "invalid_api_key")
    assert await refused_admit(r, "m", key(1)) == none_served


def test_key_refusals_in_full_and_a_key_stops_at_its_expiry_time():
    r = router([server(1)], keys=[key(1, models=["a", "b"]), key(2, expires=NOW), key(3, expires=NOW + 1)])
    assert refused(lambda: r.authorise(key_hash("k2"), "m")) == (
        401, "invalid_request_error", "invalid_api_key", None,
        "no valid API key: send 'Authorization: Bearer <key>' with a key from 'board key new'"
        " (revoked and expired keys stop working)")
    assert r.authorise(key_hash("k3"), "m")["id"] == 3  # one second left
    assert r.authorise(key_hash("k1"), "b")["id"] == 1
    assert refused(lambda: r.authorise(key_hash("k1"), LONG)) == (
        403, "invalid_request_error", "model_not_allowed", None, f"key fp1 may use a, b, not {LONG[:80]}")


async def test_unserved_model_refusals_in_full():
    planned = [{"alias": "team", "booking": 43, "start": NOW + 7200, "end": NOW + 9000, "user": "bob"},
               {"alias": "team", "booking": 41, "start": NOW - 3600, "end": NOW, "user": "bob"},  # just ended
               {"alias": "team", "booking": 42, "start": NOW + 600, "end": NOW + 4200, "user": "alice"},
               {"alias": "later", "booking": 44, "start": NOW + 7200, "end": NOW + 9000, "user": "bob"},
               {"alias": LONG, "booking": 45, "start": NOW - 60, "end": NOW + 3600, "user": "bob"}]  # still loading
    r = router([server(1, alias="m"), server(2, alias="a"), server(3, alias=LONG + "!", end=NOW + 10)],
               planned=planned)
    assert await refused_admit(r, "team", key(1)) == (
        503, "server_error", "model_not_ready", 600,
        f"team is served from {local_time(NOW + 600)} (booking 42); try again then")
    assert (await refused_admit(r, "later", key(1)))[3] == 3600  # at most an hour, however far the start
    assert await refused_admit(r, LONG, key(1)) == (
        503, "server_error", "model_not_ready", 1,
        f"{LONG[:80]} is served from {local_time(NOW - 60)} (booking 45); try again then")
    assert await refused_admit(r, LONG + "!", key(1)) == (
        503, "server_error", "model_draining", 30,
        f"{LONG[:80]}'s servers are stopping (their bookings end within 30 s)")
    assert await refused_admit(r, LONG + "?", key(1)) == (
        404, "invalid_request_error", "model_not_found", None,
        f"no server serves {LONG[:80]!r}; served now: a, m, {LONG}!")


async def test_drain_s_is_inclusive_and_a_zero_drain_still_asks_for_a_retry_a_second_later():
    r = router([server(1, end=NOW + 30), server(2, end=NOW + 31)])
    assert (await r.admit("m", key(1))).id == 2  # the first ends exactly drain_s from now
    assert await refused_admit(router([server(1, end=NOW)], drain_s=0), "m", key(1)) == (
        503, "server_error", "model_draining", 1, "m's servers are stopping (their bookings end within 0 s)")


async def test_the_per_member_cap_in_full_counts_each_request_until_it_is_released():
    r = router([server(1, parallel=8)], max_per_user=1)
    k = key(7)
    held = await r.admit("m", k)
    assert await refused_admit(r, "m", k) == (
        429, "rate_limit_exceeded", "too_many_requests_per_user", 1,
        "u7 has 1 requests in flight or waiting, the limit per member across all their keys"
        " ([gateway] max_concurrent_per_user); wait for one to finish")
    r.release(held, k)
    r = router([server(1, parallel=8)], max_per_user=2)
    a, b = await r.admit("m", k), await r.admit("m", k)
    r.release(a, k)
    assert r.in_flight == {"u7": 1}
    c = await r.admit("m", k)
    assert (await refused_admit(r, "m", k))[2] == "too_many_requests_per_user"  # b and c are in flight
    r.release(b, k)
    r.release(c, k)
    assert r.in_flight == {} and r.servers[1].outstanding == 0 and r.queue.turns == {}


async def test_a_wait_past_queue_timeout_in_full():
    r = router([server(1, alias=LONG)], queue_timeout_s=0.05)
    await r.admit(LONG, key(1))
    assert await refused_admit(r, LONG, key(2)) == (
        429, "rate_limit_exceeded", "model_busy", 1,
        f"every slot of {LONG[:80]} is busy and the wait passed 0.05 s; try again shortly")


async def test_ties_on_outstanding_go_to_the_server_with_more_slots():
    r = router([server(1, parallel=2), server(2, parallel=4)])
    assert [(await r.admit("m", key(1))).id for _ in range(3)] == [1, 2, 2]


async def test_one_class_waits_first_come_first_served():
    r = router([server(1)], queue_timeout_s=30)
    held = await r.admit("m", key(1))
    order = []

    async def wait(k):
        server = await r.admit("m", k)
        order.append(k["id"])
        r.release(server, k)

    tasks = [asyncio.create_task(wait(key(n))) for n in range(2, 8)]
    await settle()
    r.release(held, key(1))
    await asyncio.gather(*tasks)
    assert order == [2, 3, 4, 5, 6, 7]


def handed(task) -> int:
    """The server a waiting admission got: it must have got one already (waiting for it could hang on a bug)."""
    assert task.done(), "still waiting"
    return task.result().id


async def test_models_queue_apart_and_a_handed_slot_is_counted():
    r = router([server(1, alias="a"), server(2, alias="b", parallel=2)], queue_timeout_s=30)
    on_a = await r.admit("a", key(1))
    on_b = [await r.admit("b", key(2)), await r.admit("b", key(2))]
    first_on_a = asyncio.create_task(r.admit("a", key(3, "online")))  # ahead of b's waiter by class
    then_on_b = asyncio.create_task(r.admit("b", key(4, "batch")))
    await settle()
    r.release(on_b[0], key(2))  # a's waiter is still blocked; b's gets the slot
    await settle()
    assert not first_on_a.done() and handed(then_on_b) == 2 and r.servers[2].outstanding == 2
    late_on_b = asyncio.create_task(r.admit("b", key(5)))
    await settle()
    assert not late_on_b.done()  # both of b's slots are taken
    r.release(on_a, key(1))
    await settle()
    assert handed(first_on_a) == 1
    late_on_b.cancel()
    free_model = router([server(1, alias="a"), server(2, alias="b")], queue_timeout_s=30)
    await free_model.admit("a", key(1))
    waiting = asyncio.create_task(free_model.admit("a", key(2)))
    on_free_b = asyncio.create_task(free_model.admit("b", key(3)))
    await settle()
    assert handed(on_free_b) == 2  # a's queue does not hold back b
    waiting.cancel()
    await settle()


async def test_a_client_that_leaves_just_as_it_is_handed_a_slot_gives_it_to_the_next():
    r = router([server(1)], queue_timeout_s=30)
    held = await r.admit("m", key(1))
    leaving = asyncio.create_task(r.admit("m", key(2)))
    staying = asyncio.create_task(r.admit("m", key(3)))
    await settle()
    leaving.cancel()  # the client goes; before its task runs again, the slot frees and is handed to it
    r.release(held, key(1))
    await settle()
    assert leaving.cancelled() and handed(staying) == 1
    assert r.servers[1].outstanding == 1 and r.in_flight == {"u3": 1} and r.waiting() == 0


def test_a_state_carries_each_ready_servers_fields_with_defaults_for_the_optional_ones():
    bare = {"id": 2, "alias": "m", "url": "http://127.0.0.1:9002", "user": "bob", "booking": 52, "state": "ready"}
    r = router([server(1, state="starting"), bare, {**server(3, alias="n", parallel=4), "host": "gpu2",
                                                     "api_key": "s3"}])
    assert sorted(r.servers) == [2, 3]
    assert vars(r.servers[2]) == {"id": 2, "alias": "m", "url": "http://127.0.0.1:9002", "api_key": None,
                                  "parallel": 1, "user": "bob", "booking": 52, "booking_end": None, "cards": [],
                                  "state": "ready", "host": "local", "on_demand": "", "outstanding": 0}
    assert vars(r.servers[3]) == {"id": 3, "alias": "n", "url": "http://127.0.0.1:9003", "api_key": "s3",
                                  "parallel": 4, "user": "alice", "booking": 43, "booking_end": NOW + 3600,
                                  "cards": [3], "state": "ready", "host": "gpu2", "on_demand": "", "outstanding": 0}


# -- members take turns (issue 31: bob's 8 requests on an online key had carol's every request refused 429) --------


class Crowd:
    """Requests that wait for a slot and each hold it until the test releases it: `served` is the order (by name) in
    which they got one."""

    def __init__(self, r: Router) -> None:
        self.r, self.served, self.holding, self.tasks = r, [], [], []

    def send(self, name: str, k: dict) -> None:
        async def one():
            server = await self.r.admit("m", k)
            self.served.append(name)
            self.holding.append((server, k))

        self.tasks.append(asyncio.create_task(one()))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await settle()

    async def release_first(self) -> None:
        server, k = self.holding.pop(0)
        self.r.release(server, k)
        await settle()


async def test_a_member_who_comes_later_is_served_before_the_rest_of_anothers_crowd():
    r = router([server(1)], queue_timeout_s=30, max_per_user=9)
    crowd = Crowd(r)
    crowd.send("bob", key(1, user="bob"))
    await settle()
    for n in range(8):  # bob's crowd: eight more, as many keys
        crowd.send("bob", key(10 + n, user="bob"))
    await settle()
    crowd.send("carol", key(2, user="carol"))
    await settle()
    assert crowd.served == ["bob"] and r.waiting() == 9
    await crowd.release_first()
    assert crowd.served == ["bob", "carol"]  # first come would have served bob's eight first
    for _ in range(8):
        await crowd.release_first()
    assert crowd.served == ["bob", "carol"] + ["bob"] * 8
    await crowd.release_first()
    assert r.in_flight == {} and r.queue.turns == {} and r.servers[1].outstanding == 0
    await crowd.close()


async def test_members_waiting_in_one_class_take_turns_and_each_in_the_order_they_sent():
    r = router([server(1)], queue_timeout_s=30)
    crowd = Crowd(r)
    crowd.send("dave", key(9, user="dave"))
    await settle()
    for n in range(1, 5):
        crowd.send(f"bob{n}", key(n, user="bob"))
    for n in range(1, 4):
        crowd.send(f"carol{n}", key(10 + n, user="carol"))
    await settle()
    for _ in range(7):
        await crowd.release_first()
    # Neither served yet: first come (bob). Then whoever was served longest ago, until carol has none left.
    assert crowd.served == ["dave", "bob1", "carol1", "bob2", "carol2", "bob3", "carol3", "bob4"]
    await crowd.close()


async def test_a_member_alone_takes_every_slot_and_a_newcomer_waits_for_the_next_free_one():
    r = router([server(1, parallel=2), server(2, parallel=2)], queue_timeout_s=30)
    bob = [key(n, user="bob") for n in range(6)]
    alone = [await r.admit("m", k) for k in bob[:4]]  # no slot is kept back for members who are not there
    assert sorted(s.id for s in alone) == [1, 1, 2, 2]
    crowd = Crowd(r)
    crowd.send("bob", bob[4])
    crowd.send("bob", bob[5])
    crowd.send("carol", key(9, user="carol"))
    await settle()
    assert crowd.served == []  # a slot in use is never taken back
    r.release(alone[0], bob[0])
    await settle()
    assert crowd.served == ["carol"]
    r.release(alone[1], bob[1])
    await settle()
    assert crowd.served == ["carol", "bob"]
    await crowd.close()


async def test_class_order_comes_before_the_turns():
    r = router([server(1)], queue_timeout_s=30)
    crowd = Crowd(r)
    crowd.send("dave", key(9, user="dave"))
    await settle()
    crowd.send("carol", key(1, "batch", user="carol"))  # first, and due by turns after bob's first
    crowd.send("bob", key(2, "online", user="bob"))
    crowd.send("bob", key(3, "online", user="bob"))
    await settle()
    for _ in range(3):
        await crowd.release_first()
    assert crowd.served == ["dave", "bob", "bob", "carol"]
    await crowd.close()


async def test_three_hundred_keys_give_a_member_no_more_than_their_cap():
    r = router([server(1, parallel=4)], queue_timeout_s=30, max_per_user=8)
    keys = [key(n, user="bob") for n in range(300)]
    held = [await r.admit("m", k) for k in keys[:4]]
    crowd = Crowd(r)
    for k in keys[4:8]:
        crowd.send("bob", k)
    await settle()
    for k in keys[8:]:
        assert (await refused_admit(r, "m", k))[:3] == (429, "rate_limit_exceeded", "too_many_requests_per_user")
    assert r.in_flight == {"bob": 8}
    crowd.send("carol", key(999, user="carol"))  # carol is not refused: she waits, and is next
    await settle()
    r.release(held[0], keys[0])
    await settle()
    assert crowd.served == ["carol"] and r.in_flight == {"bob": 7, "carol": 1}
    await crowd.close()


# -- an alias belongs to its holder (defence in depth: the service refuses such starts, app.llama.aliases) --------


def held(id_, user, alias="m", parallel=4):
    return {**server(id_, alias=alias, parallel=parallel), "user": user}


async def test_rows_of_two_holders_under_one_alias_route_to_one_holder_only(caplog):
    # Routing by alias alone (the old rule) spreads these over all three; bob's server 2 must get none of alice's
    # alias's requests, though it is the least busy and its id lies between hers.
    r = router([held(1, "alice"), held(2, "bob"), held(3, "alice"), held(4, "bob", alias="b")])
    picked = [await r.admit("m", key(n)) for n in range(6)]
    assert sorted(s.id for s in picked) == [1, 1, 1, 3, 3, 3]
    assert [s.id for s in r.models()["m"]] == [1, 3] and r.owned_by("m") == "alice"
    assert [s.id for s in r.models()["b"]] == [4] and r.owned_by("b") == "bob"  # bob's own alias is his
    assert [m for m in caplog.messages if "not routed" in m] == [
        "server 2 (bob) serves alias m, which is alice's: not routed to"]

    # The holder keeps the alias while she serves it, though bob's server is now the oldest; once she has none
    # there, the holder of the oldest server takes it. Each shut-out server is logged once.
    r.update({"servers": [held(2, "bob"), held(3, "alice")], "keys": [], "planned": []})
    assert [s.id for s in r.models()["m"]] == [3] and sorted(r.shut_out) == [2]
    r.update({"servers": [held(2, "bob"), held(5, "carol")], "keys": [], "planned": []})
    assert [s.id for s in r.models()["m"]] == [2] and r.owned_by("m") == "bob"
    assert (await r.admit("m", key(9))).id == 2
    assert len([m for m in caplog.messages if "not routed" in m]) == 2  # server 5 (carol), once


async def test_a_shut_out_server_keeps_its_requests_in_flight_counted():
    def state(*holders):
        return {"servers": [held(1, "alice", parallel=1), held(2, "bob", parallel=1)], "keys": [], "planned": [],
                "team_aliases": {"m": {"owners": ["alice", "bob"], "holders": list(holders)}}}

    r = Router(30.0, 5.0, 8, lambda: NOW)
    r.update(state("alice", "bob"))
    busy = sorted([await r.admit("m", key(n)) for n in range(2)], key=lambda s: s.id)
    r.update(state("alice"))  # bob no longer may serve it: shut out, its request still running
    assert r.shut_out[2] is busy[1] and busy[1].outstanding == 1
    r.update(state("alice", "bob"))  # back: the same object, so its slot is still taken
    assert r.servers[2] is busy[1] and busy[1].outstanding == 1
    r.release(busy[1], key(1))
    assert busy[1].outstanding == 0


async def test_a_team_alias_routes_to_its_listed_holders_only():
    team = {"m": {"owners": ["alice", "@serving"], "holders": ["alice", "carol"]}}
    r = router([held(1, "alice", parallel=1), held(2, "bob", parallel=1), held(3, "carol", parallel=1)])
    r.update({"servers": [held(1, "alice", parallel=1), held(2, "bob", parallel=1), held(3, "carol", parallel=1)],
              "keys": [], "planned": [], "team_aliases": team})
    # Both owners serve it (one holder only would leave carol out); bob, not listed, never (all three: alias only).
    assert sorted([(await r.admit("m", key(n))).id for n in range(2)]) == [1, 3]
    assert [s.id for s in r.models()["m"]] == [1, 3] and sorted(r.shut_out) == [2]
    assert r.owned_by("m") == "alice,@serving"
    r.update({"servers": [held(2, "bob")], "keys": [], "planned": [], "team_aliases": {"m": {"owners": ["alice"],
                                                                                          "holders": []}}})
    assert "m" not in r.models() and r.owned_by("m") == "alice"


async def test_fewest_requests_in_flight_wins_over_the_emptier_share_of_a_bigger_server():
    """Least outstanding counts requests, and the share of slots only breaks its ties: a server of 8 slots with 2 in
    flight (a quarter full) loses to one of 2 slots with 1 (half full). Wrong versions: the share compared first
    (takes the 8-slot server); the most in flight first."""
    r = router([server(1, parallel=8), server(2, parallel=2)])
    k = key(1)
    held = [await r.admit("m", k) for _ in range(3)]
    assert [s.id for s in held] == [1, 2, 1]  # 0/0 tie to the older; then 1 vs 0; then 1 vs 1 to the emptier share
    assert (r.servers[1].outstanding, r.servers[2].outstanding) == (2, 1)
    assert (await r.admit("m", k)).id == 2  # 1 in flight of 2 beats 2 in flight of 8


async def test_a_full_tie_goes_to_the_oldest_server_whatever_order_the_state_lists_them_in():
    """Same slots, same load: the smallest id (the server started first), though the state lists 7 first. Wrong
    version: the newest (largest id)."""
    r = router([server(7, parallel=2), server(3, parallel=2), server(5, parallel=2)])
    k = key(1)
    assert [(await r.admit("m", k)).id for _ in range(6)] == [3, 5, 7, 3, 5, 7]


def test_every_field_the_service_routes_reaches_the_gateways_upstream():
    """The service's RoutedServer (gateway_state's servers) and the gateway's Upstream are the two sides of one wire:
    each routed field, given a value of its own, arrives on the Upstream as sent. Wrong versions: a field added to
    RoutedServer and never read by Router.update; one read under another key (api_key from "key"); a default
    (host "local") kept over the value sent."""
    from dataclasses import fields

    from app.gateway.routing import Upstream
    from app.service.ops.gateway import RoutedServer

    assert set(RoutedServer.__annotations__) == {f.name for f in fields(Upstream)} - {"outstanding"}
    sent = {"id": 7, "alias": "m7", "api_key": "sk-server-7", "url": "http://127.0.0.1:9007", "parallel": 3,
            "user": "alice", "booking": 70, "booking_end": NOW + 5000, "cards": [2, 5], "state": "ready",
            "host": "gpu2", "on_demand": "team-llm"}
    assert set(sent) == set(RoutedServer.__annotations__)
    r = Router(30.0, 5.0, 8, lambda: NOW)
    r.update({"servers": [sent], "keys": []})
    upstream = r.servers[7]
    assert {name: getattr(upstream, name) for name in sent} == sent

"""The gateway's admission rules (app.gateway.routing), on its own event loop, without HTTP: least outstanding,
the drain before a booking ends, class order then first come when slots are full, the per-key cap, and the
refusals a client sees (401, 403, 404, 503 with Retry-After for planned or draining models, 429)."""

from __future__ import annotations

import asyncio

import pytest

from app.core.keys import key_hash
from app.gateway.routing import Refused, Router

NOW = 1_800_000_000.0


def server(id_, alias="m", parallel=1, end=NOW + 3600, state="ready"):
    return {"id": id_, "alias": alias, "url": f"http://127.0.0.1:{9000 + id_}", "api_key": None, "parallel": parallel,
            "user": "alice", "booking": 40 + id_, "booking_end": end, "cards": [id_], "state": state, "host": "local"}


def key(id_, klass="batch", models=None, expires=None):
    return {"id": id_, "hash": key_hash(f"k{id_}"), "user": f"u{id_}", "models": models, "class": klass,
            "expires": expires, "revoked": None, "fingerprint": f"fp{id_}"}


async def settle():
    """Let every task run until none can go further (a woken waiter takes a few turns of the loop)."""
    for _ in range(20):
        await asyncio.sleep(0)


def router(servers, keys=(), planned=(), queue_timeout_s=5.0, max_per_key=8, drain_s=30.0):
    made = Router(drain_s, queue_timeout_s, max_per_key, lambda: NOW)
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

    async def wait(k):
        order.append((k["id"], (await r.admit("m", k)).id))

    tasks = [asyncio.create_task(wait(k)) for k in (key(2, "batch"), key(3, "experiment"), key(4, "online"),
                                                   key(5, "online"))]
    await settle()
    assert order == [] and len(r._waiting) == 4
    for n, expected in enumerate((4, 5, 2, 3), 1):
        r.release(r.servers[1], {"id": 0})
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
    assert r.servers[1].outstanding == 1 and r._waiting == [] and 2 not in r.in_flight


async def test_a_client_that_leaves_the_queue_is_forgotten():
    r = router([server(1)], queue_timeout_s=30)
    held = await r.admit("m", key(1))
    waiting = asyncio.create_task(r.admit("m", key(2)))
    await settle()
    waiting.cancel()
    await settle()
    r.release(held, key(1))
    assert r.servers[1].outstanding == 0 and r._waiting == [] and r.in_flight == {}


async def test_the_per_key_cap():
    r = router([server(1, parallel=8)], max_per_key=2)
    k = key(1)
    await r.admit("m", k)
    await r.admit("m", k)
    with pytest.raises(Refused) as refused:
        await r.admit("m", k)
    assert refused.value.status == 429 and "max_concurrent_per_key" in refused.value.message
    assert (await r.admit("m", key(2))).id == 1  # another key is not held back


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

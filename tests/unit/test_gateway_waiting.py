"""The gateway's wait queue (app.gateway.waiting): when a model's slots are full, its waiting requests are served by
class, then by their project's fair share (decayed tokens over [[projects]] share), then round-robin across the
project's members, then first come; on the queue alone, through the router, and on the wire through the gateway.
A board without [[projects]] keeps its order: class, turns, first come (tests/unit/test_gateway_routing.py)."""

from __future__ import annotations

import asyncio
import random

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from app.config import Config, GatewaySettings, Project
from app.core.keys import class_rank, key_hash
from app.gateway.routing import Refused
from app.gateway.waiting import Usage, WaitQueue, Waiter
from tests.unit.test_gateway_relay import FixedState, opened
from tests.unit.test_gateway_routing import Crowd, router, server, settle

NOW = 1_800_000_000.0
WEEK = 7 * 86400.0


class Queue:
    """A WaitQueue whose requests have names: `order()` serves them all, one slot at a time, as the router does."""

    def __init__(self, shares=None, half_life_s=WEEK) -> None:
        self.q = WaitQueue(Usage(half_life_s, shares or {}))
        self.names: dict[Waiter, str] = {}

    def send(self, name: str, user: str, project: str = "", klass: str = "batch", alias: str = "m") -> Waiter:
        waiter = self.q.push(class_rank(klass), project, user, alias, asyncio.get_running_loop().create_future())
        self.names[waiter] = name
        return waiter

    def order(self, alias: str = "m") -> list[str]:
        served = []
        while (waiter := self.q.pop(alias)) is not None:
            self.q.served(waiter.user, alias)
            served.append(self.names[waiter])
        assert not self.q.waiting(alias)
        return served


async def test_a_project_far_over_its_share_waits_behind_one_under_it_though_it_came_first():
    """Wrong version: the project left out of the order (first come, as before projects)."""
    q = Queue()
    q.q.charged("A", 50_000, NOW)
    q.q.charged("B", 1_000, NOW)
    q.send("a1", "ann", "A")
    q.send("b1", "ben", "B")
    assert q.order() == ["b1", "a1"]


async def test_tokens_that_finish_while_others_wait_move_their_project_back():
    """A request's tokens count when it finishes, and the requests already waiting are reordered by it.
    Wrong version: a project's standing read only when its request starts waiting (its heap entry never updated)."""
    q = Queue()
    q.send("a1", "ann", "A")
    q.send("b1", "ben", "B")
    q.send("a2", "amy", "A")
    q.q.charged("A", 500, NOW)
    assert q.order() == ["b1", "a1", "a2"]


async def test_the_share_divides_a_projects_usage():
    """A with share 4 and 3000 tokens stands at 750, before B's 1000 at share 1; with 5000 (1250) it stands after.
    Wrong versions: the share multiplied (12000 against 1000: B first), the share ignored (3000 against 1000)."""
    for used, expected in ((3_000, ["a1", "b1"]), (5_000, ["b1", "a1"])):
        q = Queue(shares={"A": 4.0, "B": 1.0})
        q.q.charged("A", used, NOW)
        q.q.charged("B", 1_000, NOW)
        q.send("b1", "ben", "B")
        q.send("a1", "ann", "A")
        assert q.order() == expected, used


async def test_old_tokens_count_half_each_half_life():
    """A used 64,000 tokens ten half-lives ago (62.5 now), B 100 just now: A goes first though it used more in all.
    Wrong versions: no decay (64,000 against 100: B first), a decay by e instead of 2 per half-life, the decay
    counted from the wrong end (the old tokens weighing more)."""
    usage = Usage(WEEK, {})
    usage.add("A", 1_000, NOW - WEEK)
    assert usage.tokens("A", NOW) == pytest.approx(500)
    assert usage.tokens("A", NOW + WEEK) == pytest.approx(250) and usage.tokens("B", NOW) == 0
    usage.add("A", 250, NOW)
    assert usage.tokens("A", NOW) == pytest.approx(750)
    q = Queue()
    q.q.charged("A", 64_000, NOW - 10 * WEEK)
    q.q.charged("B", 100, NOW)
    assert q.q.usage.tokens("A", NOW) == pytest.approx(62.5)
    q.send("b1", "ben", "B")
    q.send("a1", "ann", "A")
    assert q.order() == ["a1", "b1"]


async def test_equal_standings_go_first_come_and_so_does_a_project_the_config_does_not_name():
    """Wrong versions: a project's name deciding a tie; a project unknown to the config weighing 0 or failing."""
    for first, then in (("A", "B"), ("B", "A")):
        q = Queue(shares={"A": 2.0, "B": 2.0})
        q.q.charged("A", 700, NOW)
        q.q.charged("B", 700, NOW)
        q.send(first, first.lower(), first)
        q.send(then, then.lower(), then)
        assert q.order() == [first, then]
    q = Queue(shares={"A": 1.0})
    q.send("gone1", "gus", "gone")  # a key of a project since taken out of the config: share 1
    q.send("a1", "ann", "A")
    assert q.order() == ["gone1", "a1"]


async def test_class_beats_the_projects_standing():
    """A is far over its share, but its online request goes before B's batch one, which came first.
    Wrong version: the class left out of the order (or ranked after the project)."""
    q = Queue()
    q.q.charged("A", 50_000, NOW)
    q.send("b-batch", "ben", "B", "batch")
    q.send("a-batch", "ann", "A", "batch")
    q.send("a-online", "amy", "A", "online")
    assert q.order() == ["a-online", "b-batch", "a-batch"]


async def test_models_queue_apart_and_a_request_that_leaves_is_out_of_the_order():
    q = Queue()
    q.send("n1", "ann", "A", alias="n")
    leaving = q.send("a1", "ann", "A")
    q.send("b1", "ben", "B")
    q.send("a2", "ann", "A")
    assert q.q.remove(leaving) and not q.q.remove(leaving)
    q.q.charged("B", 10, NOW)
    assert q.order() == ["a2", "b1"] and q.order("n") == ["n1"]
    assert q.q.aliases() == [] and not q.q.waiting("m")


async def test_the_order_is_class_then_standing_then_turn_then_first_come_whatever_happens_in_between():
    """Many random pushes, removals, charges and serves: each request handed out is the least by the flat key
    (class, decayed tokens over share, the member's turn, arrival) among those waiting for the model.
    Wrong versions: a heap entry kept after its key changed (a member's turn, a project's tokens) and served by its
    old key; a member's or a project's entry dropped while it still has requests waiting."""
    rng = random.Random(34)
    shares = {"A": 1.0, "B": 3.0, "C": 0.5}
    q = Queue(shares=shares, half_life_s=3600)
    waiting: list[Waiter] = []
    users = {"ann": "A", "amy": "A", "ben": "B", "bea": "B", "cy": "C", "": ""}
    now = NOW

    def flat(w: Waiter) -> tuple:
        return w.rank, q.q.usage.standing(w.project), q.q.turns.get(w.user, {}).get(w.alias, -1), w.seq

    for step in range(3000):
        now += rng.choice((0, 1, 60, 600))
        move = rng.random()
        if move < 0.45:
            user = rng.choice(list(users))
            waiting.append(q.send(f"r{step}", user, users[user], rng.choice(("online", "batch", "experiment")),
                                  rng.choice(("m", "n"))))
        elif move < 0.55 and waiting:
            leaving = rng.choice(waiting)
            waiting.remove(leaving)
            assert q.q.remove(leaving)
        elif move < 0.7:
            q.q.charged(rng.choice(list(shares)), rng.randrange(1, 5000), now)
        else:
            alias = rng.choice(("m", "n"))
            expected = min((w for w in waiting if w.alias == alias), key=flat, default=None)
            got = q.q.pop(alias)
            assert got is expected, step
            if got is not None:
                waiting.remove(got)
                q.q.served(got.user, alias)
                if not any(w.user == got.user for w in waiting):
                    q.q.gone(got.user)
        assert len(q.q) == len(waiting)


# -- through the router: tokens counted as requests finish, members by user whatever their keys ---------------


def key(id_, user, project="", klass="batch"):
    return {"id": id_, "hash": key_hash(f"k{id_}"), "user": user, "models": None, "class": klass, "expires": None,
            "revoked": None, "fingerprint": f"fp{id_}", "project": project}


async def served(dave: dict, sent: list[tuple[str, dict]], tokens: dict[str, int]) -> list[str]:
    """dave holds the one slot while `sent` queue; then each, as it is served, releases with its member's tokens:
    the order in which they got the slot."""
    r = router([server(1)], queue_timeout_s=30)
    crowd = Crowd(r)
    crowd.send("dave", dave)
    await settle()
    for name, k in sent:
        crowd.send(name, k)
    await settle()
    while crowd.holding:
        held, k = crowd.holding.pop(0)
        r.release(held, k, tokens.get(k["user"], 0))
        await settle()
    await crowd.close()
    return crowd.served


async def test_members_of_one_project_alternate_whatever_keys_they_use_and_whatever_tokens_they_spend():
    """bob sends from two keys and spends 1000 tokens a request, carol 10 from one: they take turns, because tokens
    count against the project, never a member within it.
    Wrong versions: round-robin by key (bob's second key, never served, goes before carol); fair share by member
    (carol's cheaper requests all first)."""
    bob1, bob2, carol = key(1, "bob", "A"), key(2, "bob", "A"), key(3, "carol", "A")
    sent = [("bob1", bob1), ("bob2", bob2), ("carol1", carol), ("bob3", bob1), ("carol2", carol)]
    assert await served(key(9, "dave", "A"), sent, {"bob": 1_000, "carol": 10}) == [
        "dave", "bob1", "carol1", "bob2", "carol2", "bob3"]


async def test_the_router_counts_a_finished_requests_tokens_against_its_keys_project_before_the_next_is_served():
    """dave (A) holds the slot; ann (A) waits, then ben (B). dave's 5000 tokens, counted as he releases, put A
    behind B; ann's own tokens after that do not matter (B's request is served already).
    Wrong versions: tokens counted after the next request is handed the slot; the key's project not read (all one)."""
    r = router([server(1)], queue_timeout_s=30)
    crowd = Crowd(r)
    dave = key(9, "dave", "A")
    crowd.send("dave", dave)
    await settle()
    crowd.send("ann", key(1, "ann", "A"))
    await settle()
    crowd.send("ben", key(2, "ben", "B"))
    await settle()
    held, _ = crowd.holding.pop(0)
    r.release(held, dave, 5_000)
    await settle()
    assert crowd.served == ["dave", "ben"]
    await crowd.release_first()
    assert crowd.served == ["dave", "ben", "ann"]
    assert r.queue.usage.tokens("A", NOW) == pytest.approx(5_000) and r.queue.usage.tokens("B", NOW) == 0
    await crowd.close()


async def test_without_projects_tokens_change_nothing_the_order_is_class_then_turns_then_first_come():
    """Keys without a project (a board without [[projects]], or a service that does not send it yet) are all in
    the implicit project: the order is today's, whoever spends what.
    Wrong versions: fair share by member; a key without "project" refused or its None taken for a project of its own."""
    bob, carol = key(1, "bob"), {**key(2, "carol"), "project": None}
    del bob["project"]
    sent = [("bob1", bob), ("bob2", bob), ("carol1", carol), ("carol2", carol), ("erin", key(3, "erin", "", "online"))]
    assert await served(key(9, "dave"), sent, {"bob": 10_000, "carol": 1}) == [
        "dave", "erin", "bob1", "carol1", "bob2", "carol2"]


async def test_the_wait_past_queue_timeout_is_still_429_and_leaves_the_order_whole():
    r = router([server(1)], queue_timeout_s=0.05)
    await r.admit("m", key(1, "ann", "A"))
    with pytest.raises(Refused) as refused:
        await r.admit("m", key(2, "ben", "B"))
    assert refused.value.status == 429 and r.waiting() == 0 and r.queue.aliases() == []


# -- on the wire: the real gateway, its one slot held, requests queued --------------------------------------


async def test_on_the_wire_a_project_under_its_share_is_relayed_before_one_over_it_that_came_first():
    """ben (project B, share 2) has spent 6000 tokens (3000 against his share); then the gateway's one slot is held by
    hal (project A, share 1), and ann (A) asks, then ben. hal's answer says 5000 tokens: as his request ends, A stands
    at 5000 against B's 3000, so ben's request reaches the server before ann's, though ann came first.
    Wrong versions: the gateway not handing the answer's tokens to the router (first come: ann, then ben); the
    config's shares not reaching the router, or multiplied (B at 6000 or 12000: ann first)."""
    arrived: list[str] = []
    holding = asyncio.Event()
    release = asyncio.Event()

    async def chat(request):
        body = await request.json()
        name = body["messages"][0]["content"]
        arrived.append(name)
        if name == "hal":
            holding.set()
            await release.wait()
        return web.json_response({"choices": [], "usage": {"prompt_tokens": body["max_tokens"],
                                                           "completion_tokens": 0}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    upstream = TestServer(app)
    await upstream.start_server()
    state = FixedState(str(upstream.make_url("")).rstrip("/"), parallel=1)
    keys = {"hal": "A", "ann": "A", "ben": "B"}
    state.state["keys"] = [{**key(n, user, project), "hash": key_hash(f"bk-{user}")}
                           for n, (user, project) in enumerate(keys.items())]
    config = Config(gateway=GatewaySettings(queue_timeout_s=30),
                    projects=(Project(name="A", members=("hal", "ann")), Project(name="B", members=("ben",), share=2)))

    async with opened(state, config) as (client, made):
        async def ask(user: str, tokens: int) -> int:
            answer = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer bk-{user}"},
                                       json={"model": "m", "max_tokens": tokens,
                                             "messages": [{"role": "user", "content": user}]})
            return answer.status

        async def until(done) -> None:
            while not done():  # the gateway's handlers go on after the client has its answer, on this same loop
                await asyncio.sleep(0.005)

        assert await ask("ben", 6_000) == 200
        await asyncio.wait_for(until(lambda: not made.router.in_flight), 10)  # his slot released, his tokens counted
        hal = asyncio.create_task(ask("hal", 5_000))
        await asyncio.wait_for(holding.wait(), 10)
        ann = asyncio.create_task(ask("ann", 0))
        await asyncio.wait_for(until(lambda: made.router.waiting() == 1), 10)
        ben = asyncio.create_task(ask("ben", 0))
        await asyncio.wait_for(until(lambda: made.router.waiting() == 2), 10)
        release.set()
        assert await asyncio.wait_for(asyncio.gather(hal, ann, ben), 10) == [200, 200, 200]
    await upstream.close()
    assert arrived == ["ben", "hal", "ben", "ann"]


async def test_a_starting_gateway_seeds_its_fair_order_once_with_what_the_service_recorded():
    """The first state with fair_use (the projects' recorded tokens, decayed to the state's now) seeds the order:
    A, which used 700 tokens before this gateway began, waits behind B; a later state's fair_use adds nothing. The
    gateway asks for it until it has it, and not after.
    Wrong versions: the past use ignored (A first, first come); seeded on every state (A's use doubled); asked on
    every refresh."""
    config = Config(projects=(Project(name="A", members=("alice",)), Project(name="B", members=("bob",))))
    state = FixedState("http://127.0.0.1:9")
    asked = []
    answer = state.call

    def call(op, **args):
        asked.append(args.get("fair_use", False))
        return {**answer(op, **args), "now": 1_800_000_000, "fair_use": {"A": 700.0}} if op == "gateway_state" \
            else answer(op, **args)

    state.call = call
    async with opened(state, config) as (_, gateway):
        usage = gateway.router.queue.usage
        assert usage.tokens("A", 1_800_000_000) == pytest.approx(700.0)
        assert usage.standing("A") > usage.standing("B")  # B (nothing yet) goes first
        gateway._update(state.call("gateway_state"))
        assert usage.tokens("A", 1_800_000_000) == pytest.approx(700.0)
        assert asked[0] is True and gateway.fair_seeded

"""The gateway's budgets and rate limits (app.gateway.limits) on a pinned clock: a project's tokens a day up to the
policy zone's midnight, requests and tokens a minute per key and per project in a sliding window, and what counts;
then through the gateway in process (TestGateway: its HTTP door, an upstream that reports usage, the official
`openai` client, the same pinned clock). End to end with the real service and llama-server:
tests/llama/test_gateway_budgets.py."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.config import Config, GatewaySettings, Policy, Project
from app.gateway.limits import Limits
from app.gateway.routing import Refused
from app.gateway.server import Gateway
from tests.unit.test_gateway_relay import KEY, FixedState

openai = pytest.importorskip("openai")

# Sat 2026-12-05 22:30 in Berlin (21:30 UTC): Berlin's midnight is 1 h 30 min away, UTC's 2 h 30 min.
BERLIN_2230 = 1796506200
BERLIN_MIDNIGHT = 1796511600
BERLIN_DAY_START = 1796425200
# Sun 2026-03-29 12:00 in Berlin, the day the clocks go forward: 23 hours long, its midnight 12 h away (not 13).
DST_NOON, DST_MIDNIGHT = 1774778400, 1774821600


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def limits(now: float = BERLIN_2230, *, key_rpm=None, key_tpm=None, zone: str | None = "Europe/Berlin",
           **project) -> tuple[Limits, Clock]:
    """Limits with projects A (alice, bob; `project`'s limits) and B (carol, none), on a clock pinned at `now`."""
    config = Config(gateway=GatewaySettings(key_rpm=key_rpm, key_tpm=key_tpm), policy=Policy(timezone=zone),
                    projects=(Project(name="A", members=("alice", "bob"), **project),
                              Project(name="B", members=("carol",))))
    clock = Clock(now)
    return Limits(config, clock), clock


def key(id: int, project: str = "A") -> dict:
    return {"id": id, "fingerprint": f"fp{id}", "user": "alice", "project": project}


def refused(made: Limits, which: dict) -> Refused:
    with pytest.raises(Refused) as caught:
        made.admit(which)
    error = caught.value
    assert (error.status, error.kind) == (429, "rate_limit_exceeded")
    return error


class TestRequestsAMinute:
    def test_the_nth_request_in_the_minute_is_admitted_the_next_refused_until_the_first_leaves_the_window(self):
        """key_rpm 3: requests at +0, +20, +40 are admitted, one at +50 is refused with Retry-After 10 (the first
        leaves at +60), at +59 still refused (1 s), at +60 admitted. A clock minute starting at +30 would have let
        the one at +50 through.
        Wrong versions: the limit off by one (`>` for `>=`: a 4th admitted; or the 3rd refused), a fixed window (the
        one at +50 admitted in a new clock minute), Retry-After from the newest request (50 s) or a whole minute."""
        made, clock = limits(BERLIN_2230 - 30, key_rpm=3)  # a clock minute starts 30 s in
        for at in (0, 20, 40):
            clock.now = BERLIN_2230 - 30 + at
            made.admit(key(1))
        clock.now = BERLIN_2230 - 30 + 50
        error = refused(made, key(1))
        assert (error.code, error.retry_after) == ("key_requests_per_minute", 10)
        assert error.message == ("key fp1 made 3 requests in the last minute, the most [gateway] key_rpm lets through;"
                                 " try again in 10 s")
        clock.now = BERLIN_2230 - 30 + 59
        assert refused(made, key(1)).retry_after == 1
        clock.now = BERLIN_2230 - 30 + 60
        made.admit(key(1))
        assert refused(made, key(1)).retry_after == 20  # now +20, +40, +60 are in it

    def test_refused_requests_count_nothing_here_or_after_admission(self):
        """Refused here (over the limit) or by the routing after admission (cancel): neither counts. Two refused at
        +10 and one admitted then cancelled at +30 leave the window at +0 and +5 only: one more fits at +30 and at
        +61 (the +0 one gone) another.
        Wrong versions: a refusal counted (the window would hold 4 and refuse at +30), cancel not taking back the
        admission (refused at +61)."""
        made, clock = limits(key_rpm=3)
        start = clock.now
        made.admit(key(1))
        clock.now = start + 5
        made.admit(key(1))
        clock.now = start + 10
        made.admit(key(1))
        refused(made, key(1))
        refused(made, key(1))
        clock.now = start + 30
        with pytest.raises(Refused):
            made.admit(key(1))
        clock.now = start + 60  # the +0 one left
        made.cancel(made.admit(key(1)))  # admitted, then refused by the routing: taken back
        clock.now = start + 65  # the +5 one left too: +10 is all that is in it
        made.admit(key(1))
        made.admit(key(1))
        refused(made, key(1))

    def test_a_projects_rpm_counts_its_keys_together_and_no_other_projects(self):
        """Project A's rpm 2: A's keys 1 and 2 make 2 requests together, the 3rd (either key) is refused naming the
        project; B's key is not counted in it, and each key has no limit of its own here.
        Wrong versions: the project's window per key (key 2 admitted), B's key counted in A's window."""
        made, _ = limits(rpm=2)
        made.admit(key(3, "B"))
        made.admit(key(1))
        made.admit(key(2))
        error = refused(made, key(2))
        assert error.code == "project_requests_per_minute" and error.message.startswith(
            "project A's keys made 2 requests in the last minute, the most [[projects]] rpm lets through")
        for _ in range(5):
            made.admit(key(3, "B"))


class TestTokensAMinute:
    def test_a_keys_tokens_in_the_window_at_the_limit_refuse_and_under_it_admit(self):
        """key_tpm 100: 60 tokens at +0 and 39 at +10 (99) admit; 1 more at +20 (100) refuses until the +0 answer
        leaves the window (Retry-After 40 at +20), then 40 left admit.
        Wrong versions: `>` for `>=` (100 admitted), the wait from the newest answer, tokens counted per request
        (3 requests under any tpm)."""
        made, clock = limits(key_tpm=100)
        start = clock.now
        made.spend(key(1), 60)
        clock.now = start + 10
        made.spend(key(1), 39)
        made.admit(key(1))
        clock.now = start + 20
        made.spend(key(1), 1)
        error = refused(made, key(1))
        assert (error.code, error.retry_after) == ("key_tokens_per_minute", 40)
        assert error.message == "key fp1 used 100 tokens in the last minute; [gateway] key_tpm is 100; try again in 40 s"
        clock.now = start + 60
        made.admit(key(1))

    def test_a_projects_tpm_counts_its_keys_answers_and_not_the_other_projects(self):
        """Project A's tpm 50: 30 tokens on key 1 and 20 on key 2 refuse key 3 of A; 1000 tokens on B's key do
        not count in A's window (A under it: admitted).
        Wrong versions: each key's own tokens only, every project's tokens counted."""
        made, _ = limits(tpm=50)
        made.spend(key(9, "B"), 1000)
        made.spend(key(1), 30)
        made.admit(key(3))
        made.spend(key(2), 20)
        assert refused(made, key(3)).code == "project_tokens_per_minute"


class TestTokensADay:
    def test_a_spent_budget_refuses_until_the_policy_zones_midnight(self):
        """tokens_per_day 1000 in Europe/Berlin at 22:30 there: 999 admit, 1000 refuse with Retry-After 5400 (Berlin's
        midnight, not UTC's 9000) and the message says when; at midnight it admits again, the count at 0.
        Wrong versions: `>` for `>=` (1000 admitted), the reset at UTC's or the system's midnight, 24 h from the
        request, the count not started again at midnight."""
        made, clock = limits(tokens_per_day=1000)
        made.spend(key(1), 999)
        made.admit(key(1))
        made.spend(key(2), 1)
        error = refused(made, key(1))
        assert (error.code, error.retry_after) == ("project_tokens_per_day", BERLIN_MIDNIGHT - BERLIN_2230)
        assert error.message == ("project A has used 1000 of its 1000 tokens for today ([[projects]] tokens_per_day);"
                                 " it starts again at midnight, Sun 00:00 Europe/Berlin")
        clock.now = BERLIN_MIDNIGHT - 1
        assert refused(made, key(1)).retry_after == 1
        clock.now = BERLIN_MIDNIGHT
        made.admit(key(1))
        made.spend(key(1), 999)
        made.admit(key(1))

    def test_a_day_the_clocks_go_forward_resets_at_its_midnight_23_hours_on(self):
        """At noon on 29 March in Berlin the next midnight is 12 h away (the day is 23 h long).
        Wrong version: the day's start + 24 h (13 h)."""
        made, _ = limits(DST_NOON, tokens_per_day=1)
        made.spend(key(1), 5)
        assert refused(made, key(1)).retry_after == DST_MIDNIGHT - DST_NOON == 12 * 3600

    def test_only_the_keys_own_projects_tokens_count(self):
        """A at 1000 of 1000 is refused; B's key, with no budget, goes on; B's tokens never count in A's day.
        Wrong versions: every project's tokens summed, a budget applied to the other project's keys."""
        made, _ = limits(tokens_per_day=1000)
        made.spend(key(5, "B"), 5000)
        made.admit(key(1))
        made.spend(key(1), 1000)
        refused(made, key(1))
        made.admit(key(5, "B"))

    def test_what_the_service_recorded_today_counts_once_and_yesterdays_not_at_all(self):
        """gateway_state's tokens_today: taken at the first state of the day (the service's 600 before the gateway
        started, plus the 300 counted here: 900), never again (a later state's 600 is not added again: the gateway's
        own count includes what it flushed), and not at all when it is another day's.
        Wrong versions: each state added (1500 refused at 1000), a state's count taken as the day's (300 lost), a
        count of yesterday's taken."""
        made, _ = limits(tokens_per_day=1000)
        made.seed({"since": BERLIN_DAY_START - 86400, "projects": {"A": 5000}})  # yesterday's: not today's
        made.admit(key(1))
        made.spend(key(1), 300)
        made.seed({"since": BERLIN_DAY_START, "projects": {"A": 600, "B": 50}})
        made.seed({"since": BERLIN_DAY_START, "projects": {"A": 600}})
        assert made.spent == {"A": 900, "B": 50}
        made.admit(key(1))
        made.spend(key(1), 100)
        refused(made, key(1))

    def test_the_limit_that_frees_last_is_the_one_named(self):
        """Key 1 over key_tpm (its 10 tokens at +0 leave at +60) and A over its rpm (key 2's request at +1 leaves at
        +61): at +2 the project's limit is named, Retry-After 59, though the key's is checked first.
        Wrong version: the first limit found named (a client that waits its Retry-After, 58, is refused again)."""
        made, clock = limits(key_tpm=10, rpm=1)
        start = clock.now
        made.spend(key(1), 10)
        clock.now = start + 1
        made.admit(key(2))
        clock.now = start + 2
        error = refused(made, key(1))
        assert (error.code, error.retry_after) == ("project_requests_per_minute", 59)


def test_a_board_without_projects_or_key_limits_counts_nothing_and_refuses_nothing():
    """No [[projects]], no key_rpm/key_tpm: any number of requests and tokens, nothing kept (no window per key).
    Wrong version: a window made for every key whatever its limits (memory that grows with the keys for nothing)."""
    made = Limits(Config(), Clock(BERLIN_2230))
    implicit = {"id": 1, "fingerprint": "fp", "user": "alice", "project": ""}
    for _ in range(1000):
        made.admit(implicit)
        made.spend(implicit, 10**6)
    assert (made.keys, made.project_windows, made.spent) == ({}, {}, {})


# -- through the gateway --------------------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def gateway(clock: Clock, project: str = "A", *, projects: tuple[Project, ...] | None = None, **settings):
    """The gateway in process on `clock`, its one key (bob's) for `project`, before an upstream whose every answer
    used 11 + 4 tokens: (an AsyncOpenAI client with that key, the gateway, the state with its accounting)."""
    async def chat(request):
        return web.json_response({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}})

    upstream_app = web.Application()
    upstream_app.router.add_post("/v1/chat/completions", chat)
    upstream = TestServer(upstream_app)
    await upstream.start_server()
    state = FixedState(str(upstream.make_url("")).rstrip("/"))
    state.state["keys"][0]["project"] = project
    if projects is None:
        projects = (Project(name="A", members=("bob",), tokens_per_day=40),)
    config = Config(gateway=GatewaySettings(**settings), policy=Policy(timezone="Europe/Berlin"), projects=projects)
    made = Gateway(config, state, clock=clock)
    client = TestClient(TestServer(made.app()))
    await client.start_server()
    try:
        while not made.router.known:
            await asyncio.sleep(0.01)
        yield openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key=KEY, max_retries=0, timeout=30), \
            made, state
    finally:
        await client.close()
        await upstream.close()


async def chat(client, model: str = "m"):
    return await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])


async def rate_limited(client) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as caught:
        await chat(client)
    return caught.value


class TestGateway:
    async def test_a_keys_nth_request_in_the_minute_passes_the_next_is_429_with_retry_after_and_a_new_minute_passes(
            self):
        """key_rpm 3 (its project without limits): three answered at +0, +10, +20; the 4th at +30 is the openai
        client's RateLimitError, OpenAI's error shape, Retry-After 30 (the +0 one leaves at +60); at +60 one passes.
        Wrong versions: the gateway's limits on another clock than its own (time.time: nothing passes at "+60"),
        Retry-After missing or a whole minute, the limit not read from [gateway] key_rpm."""
        clock = Clock(BERLIN_2230)
        async with gateway(clock, "B", projects=(Project(name="B", members=("bob",)),), key_rpm=3) as (client, _, _):
            for at in (0, 10, 20):
                clock.now = BERLIN_2230 + at
                assert (await chat(client)).usage.total_tokens == 15
            clock.now = BERLIN_2230 + 30
            error = await rate_limited(client)
            assert error.response.status_code == 429 and error.response.headers["Retry-After"] == "30"
            assert error.body == {"message": "key fp made 3 requests in the last minute, the most [gateway] key_rpm"
                                             " lets through; try again in 30 s", "type": "rate_limit_exceeded",
                                  "code": "key_requests_per_minute"}
            clock.now = BERLIN_2230 + 60
            await chat(client)

    async def test_a_projects_spent_day_is_429_with_retry_after_at_the_policy_zones_midnight(self):
        """Project A's 40 tokens a day: three answers (15 each, counted as each ends, before any flush) pass, 45
        tokens: the 4th is refused with Retry-After 5400 (Berlin's midnight from 22:30 there); at midnight it passes.
        Each answer's accounting record carries the project.
        Wrong versions: tokens counted only once flushed to the service (a 4th passes), Retry-After to UTC's
        midnight (9000), the record without its project."""
        clock = Clock(BERLIN_2230)
        async with gateway(clock) as (client, made, state):
            for _ in range(3):
                await chat(client)
            assert state.usage == []  # nothing flushed yet
            error = await rate_limited(client)
            assert error.response.headers["Retry-After"] == str(BERLIN_MIDNIGHT - BERLIN_2230)
            assert error.code == "project_tokens_per_day" and error.type == "rate_limit_exceeded"
            clock.now = BERLIN_MIDNIGHT
            await chat(client)
            await made._flush()
            assert [(r["project"], r["status"]) for r in state.usage] == [("A", 200)] * 3 + [("A", 429), ("A", 200)]

    async def test_a_keys_tokens_a_minute_are_enforced_and_a_refused_or_unrouted_request_counts_nothing(self):
        """key_tpm 30 and key_rpm 3: a request for a model no one serves (404) and the requests refused 429 count
        toward neither limit; two answers (30 tokens) make the next 429 (tokens), which at +60 passes again.
        Wrong versions: the 404 counted as a request (the 3rd answer refused by rpm), a refusal's tokens (0) or
        request counted, tpm off by one (30 let through)."""
        clock = Clock(BERLIN_2230)
        async with gateway(clock, key_tpm=30, key_rpm=3) as (client, _, _):
            with pytest.raises(openai.NotFoundError):
                await chat(client, model="nobody-serves-this")
            await chat(client)
            await chat(client)
            assert (await rate_limited(client)).code == "key_tokens_per_minute"
            assert (await rate_limited(client)).code == "key_tokens_per_minute"
            clock.now = BERLIN_2230 + 60
            await chat(client)

    async def test_a_board_without_projects_or_limits_answers_as_before(self):
        """No [[projects]], no key limits: fifty requests at one instant all pass, and the records are as before (no
        "project").
        Wrong version: a limit applied with none configured, "project": "" added to every record."""
        clock = Clock(BERLIN_2230)
        async with gateway(clock, "", projects=()) as (client, made, state):
            for _ in range(50):
                await chat(client)
            await made._flush()
            assert len(state.usage) == 50 and not any("project" in r for r in state.usage)

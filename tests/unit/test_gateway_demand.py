"""Catalog models started on demand, the gateway's side (app.gateway.demand), in process: the real gateway and router
against an aiohttp upstream, and a stand-in for the service's model_demand and models_touch where the real ones
would need a runner and a llama-server (tests/llama/test_on_demand.py runs it all for real). The stand-in answers in
the wire's shapes (SERVICE.md); the service's push of a new gateway_state is the test calling Gateway._update, as
the gateway's follow thread does."""

# ruff: noqa: F811 (the tests take test_gateway_relay's `upstream` fixture, imported here, as their argument)
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from aiohttp import web
from aiohttp.test_utils import TestServer

from app.config import CatalogModel, Config, GatewaySettings, LlamaSettings
from app.errors import ServiceDown
from app.gateway.demand import READY_MARGIN_S, Demand
from tests.unit.test_gateway_relay import KEY, FixedState, opened, upstream  # noqa: F401

HEADERS = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "cold-llm", "messages": [{"role": "user", "content": "hi"}]}


def starting(booking: int = 41, cards: tuple[int, ...] = (2, 3)) -> dict:
    return {"state": "starting", "booking": booking, "server": None, "cards": list(cards), "message": None,
            "retry_after": None, "free_at": None}


def unavailable(message: str, retry_after: int | None = 1500) -> dict:
    return {"state": "unavailable", "booking": None, "server": None, "cards": [], "message": message,
            "retry_after": retry_after, "free_at": None}


class Service(FixedState):
    """gateway_state (nothing served until the test says), and model_demand / models_touch answered as the service
    answers them: each alias's reply is the test's; a call waits for `gate`."""

    def __init__(self, upstream: str, replies: dict[str, dict]) -> None:
        super().__init__(upstream)
        self.url = upstream
        self.served = self.state["servers"].pop()  # a member's server of alias m: nothing served until the test says
        self.warm = {**self.served, "id": 8, "alias": "warm-llm", "user": "board-llama", "on_demand": "warm-llm"}
        self.replies = replies
        self.demands: list[str] = []
        self.touches: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.away = False

    def call(self, op, **args):
        if op == "model_demand":
            self.demands.append(args["alias"])
            assert self.gate.wait(10)
            return {"alias": args["alias"], **self.replies[args["alias"]]}
        if op == "models_touch":
            if self.away:
                raise ServiceDown("the board service does not answer on /run/board/board.sock")
            self.touches.append(args["aliases"])
            return {"extended": {}}
        return super().call(op, **args)

    def serve(self, made, alias: str, server_id: int, **fields) -> None:
        """A ready server of `alias` in the state, pushed to the gateway as the service's event would."""
        self.state["servers"].append({**self.served, "id": server_id, "alias": alias, "user": "board-llama",
                                      "on_demand": alias, **fields})
        made._update(self.state)


def catalog(ready_timeout_s: float = 60.0, **settings) -> Config:
    return Config(models=(CatalogModel(alias="cold-llm", model="/models/cold.gguf", fallbacks=("spare-llm", "warm-llm")),
                          CatalogModel(alias="spare-llm", model="/models/spare.gguf"),
                          CatalogModel(alias="warm-llm", model="/models/warm.gguf"),
                          CatalogModel(alias="hidden-llm", model="/models/hidden.gguf", project="research")),
                  gateway=GatewaySettings(**settings), llama=LlamaSettings(ready_timeout_s=ready_timeout_s))


async def until(condition, limit: int = 500) -> None:
    for _ in range(limit):  # bounded: 5 s
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_two_requests_at_once_for_a_cold_alias_make_one_demand_and_both_are_answered_by_its_server(upstream):
    """Both requests wait on the one model_demand in flight, then on the server, and are relayed to it once the state
    lists it ready. Wrong versions: a model_demand per request (two calls: two bookings); the wait woken only by
    a poll that never comes (the requests hang); a request relayed before its server is ready (nothing to relay to)."""
    server, seen, _ = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {"cold-llm": starting()})
    state.gate.clear()
    async with opened(state, catalog()) as (client, made):
        asked = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=HEADERS))
                 for _ in range(2)]
        await until(lambda: made.demand.busy["cold-llm"] == 2)  # both in the shared call's wait
        state.gate.set()
        await until(lambda: "cold-llm" in made.router._watching)
        assert state.demands == ["cold-llm"] and seen == []
        state.serve(made, "cold-llm", 20)
        answers = await asyncio.wait_for(asyncio.gather(*asked), 10)
        assert [a.status for a in answers] == [200, 200]
        assert [s["body"]["model"] for s in seen] == ["cold-llm", "cold-llm"]
        assert made.router.in_flight == {} and made.demand.busy == {}


async def test_a_streamed_request_gets_its_head_and_a_starting_comment_at_once_then_the_servers_stream(
        upstream, monkeypatch):
    """While its model starts, a streamed request has its 200 event-stream head and `: board: starting ALIAS on cards
    2-3`, again each KEEP_ALIVE_S; then the server's events follow in the same stream. Wrong versions: the head held
    back until the server is ready; one comment only; the cards listed one by one ("2,3")."""
    monkeypatch.setattr("app.gateway.server.KEEP_ALIVE_S", 0.01)
    server, _, release = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {"cold-llm": starting()})
    async with opened(state, catalog()) as (client, made):
        answer = await asyncio.wait_for(client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                                    headers=HEADERS), 10)
        assert answer.status == 200 and answer.headers["Content-Type"] == "text/event-stream"
        comment = b": board: starting cold-llm on cards 2-3\n"
        assert await asyncio.wait_for(answer.content.readline(), 10) == comment
        assert await asyncio.wait_for(answer.content.readline(), 10) == b"\n"
        assert await asyncio.wait_for(answer.content.readline(), 10) == comment  # the next beat
        state.serve(made, "cold-llm", 20)
        release.set()
        rest = await asyncio.wait_for(answer.content.read(), 10)
        events = [line for line in rest.split(b"\n") if line.startswith(b"data: ")]
        assert events[0] == b'data: {"choices":[{"delta":{"content":"first"}}]}' and events[-1] == b"data: [DONE]"
        await made._flush()
        assert [(r["model"], r["status"], r["completion_tokens"]) for r in state.usage] == [("cold-llm", 200, 9)]


@pytest.mark.parametrize("status, body, event", [
    (400, {"error": {"message": "the prompt is too long", "type": "invalid_request_error",
                     "code": "context_length_exceeded"}},
     b'data: {"error": {"message": "the prompt is too long", "type": "invalid_request_error", "code":'
     b' "context_length_exceeded"}}\n\n'),
    (200, {"object": "list", "usage": {"prompt_tokens": 5, "completion_tokens": 0}},
     b'data: { "object": "list", "usage": {  "prompt_tokens": 5,  "completion_tokens": 0 }}\n\n')],  # on one line
    ids=["error", "not-streamed"])
async def test_an_answer_that_is_not_a_stream_after_the_head_is_one_event(upstream, status, body, event):
    """The head went out as 200 while the model started; the server then answers with JSON, not a stream: an error
    status is the stream's one event, its error in OpenAI's shape, accounted with its status; a 200 (a route that
    does not stream) is one data event, its tokens counted. Wrong versions: the body written raw into the stream (no
    `data:`), or the 200's over several lines (the event ends at its first); accounted 200 for the error; the 200's
    body lost."""
    server, _, _ = upstream
    answering = web.Application()

    async def answer(request):
        return web.json_response(body, status=status, dumps=lambda doc: json.dumps(doc, indent=1))

    answering.router.add_post("/v1/chat/completions", answer)
    other = TestServer(answering)
    await other.start_server()
    state = Service(str(server.make_url("")).rstrip("/"), {"cold-llm": starting()})
    try:
        async with opened(state, catalog()) as (client, made):
            asked = asyncio.create_task(client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                                    headers=HEADERS))
            await until(lambda: "cold-llm" in made.router._watching)
            state.serve(made, "cold-llm", 20, url=str(other.make_url("")).rstrip("/"))
            answered = await asyncio.wait_for(asked, 10)
            text = await asyncio.wait_for(answered.read(), 10)
            assert answered.status == 200 and text.endswith(event), text
            await made._flush()
            assert [(r["status"], r["prompt_tokens"]) for r in state.usage] == [(status, 5 if status == 200 else 0)]
    finally:
        await other.close()


async def test_unavailable_goes_to_the_fallbacks_in_order_and_the_reply_names_the_one_that_answered(upstream):
    """cold-llm cannot start; its first fallback (spare-llm, a catalog alias) cannot either; its second (warm-llm,
    served now) answers, and the body it gets says "model": "warm-llm". Wrong versions: the body's model left as
    asked (the reply says cold-llm); the fallbacks in reverse order (warm-llm asked first, spare-llm never); the first
    failure ending it."""
    server, seen, _ = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {
        "cold-llm": unavailable("cold-llm needs 2 cards; none are free now"),
        "spare-llm": unavailable("spare-llm needs 1 card; none are free now")})
    async with opened(state, catalog()) as (client, made):
        made._update({**state.state, "servers": [state.warm]})
        answer = await client.post("/v1/chat/completions", json=CHAT, headers=HEADERS)
        assert answer.status == 200
        assert state.demands == ["cold-llm", "spare-llm"] and [s["body"]["model"] for s in seen] == ["warm-llm"]
        await made._flush()
        assert [(r["model"], r["server_id"]) for r in state.usage] == [("warm-llm", 8)]


async def test_a_fallback_outside_the_keys_models_is_never_used(upstream):
    """A key scoped to cold-llm alone is not answered by warm-llm, which it may not use: 503 as if no fallback were
    configured. Wrong versions: fallbacks taken without the key's scope (the key reaches a model it may not)."""
    server, seen, _ = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {"cold-llm": unavailable("none free", 90),
                                                             "spare-llm": unavailable("none free")})
    state.state["keys"][0]["models"] = ["cold-llm"]
    async with opened(state, catalog()) as (client, made):
        made._update({**state.state, "servers": [state.warm]})
        answer = await client.post("/v1/chat/completions", json=CHAT, headers=HEADERS)
        assert answer.status == 503 and seen == [] and state.demands == ["cold-llm"]


async def test_nothing_free_is_503_no_free_cards_with_the_services_retry_after_and_its_line(upstream):
    """Nothing can start, no fallback answers: 503 in OpenAI's shape, code no_free_cards, Retry-After the service's
    retry_after (a minute when it names none), the message the service's line (the first alias's, the one asked).
    Wrong versions: 404 (taken for an unknown model); Retry-After always the default 60 s; the last fallback's
    message."""
    server, seen, _ = upstream
    line = "cold-llm needs 2 cards of pool prod; none are free now; the earliest is Sat 14:00 (in 25 min)"
    state = Service(str(server.make_url("")).rstrip("/"), {"cold-llm": unavailable(line, 1500),
                                                             "spare-llm": unavailable("spare: none", 30),
                                                             "warm-llm": unavailable("warm: none", 20)})
    async with opened(state, catalog()) as (client, made):
        answer = await client.post("/v1/chat/completions", json=CHAT, headers=HEADERS)
        assert answer.status == 503 and answer.headers["Retry-After"] == "1500"
        assert await answer.json() == {"error": {"message": line, "type": "server_error", "code": "no_free_cards"}}
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=HEADERS)
        assert streamed.status == 503 and streamed.headers["Retry-After"] == "1500"  # no head was sent before it
        state.replies["cold-llm"] = unavailable(line, None)  # the service names no time: a minute
        answer = await client.post("/v1/chat/completions", json=CHAT, headers=HEADERS)
        assert answer.status == 503 and answer.headers["Retry-After"] == "60"
        assert seen == []
        await made._flush()
        assert [(r["model"], r["status"]) for r in state.usage] == [("cold-llm", 503)] * 3


async def test_busy_past_the_queues_wait_tries_the_fallbacks(upstream):
    """cold-llm's one slot is held by a stream; a second request waits past queue_timeout_s and is answered by its
    fallback warm-llm. Wrong versions: the 429 model_busy returned as before (the fallbacks only for a cold alias)."""
    server, seen, release = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {"spare-llm": unavailable("none free")})
    async with opened(state, catalog(queue_timeout_s=0.2)) as (client, made):
        made._update({**state.state, "servers": [state.warm, {**state.warm, "id": 20, "alias": "cold-llm",
                                                              "parallel": 1, "on_demand": "cold-llm"}]})
        holding = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=HEADERS)
        await asyncio.wait_for(holding.content.readline(), 10)
        answer = await asyncio.wait_for(client.post("/v1/chat/completions", json=CHAT, headers=HEADERS), 10)
        assert answer.status == 200 and [s["body"]["model"] for s in seen] == ["cold-llm", "warm-llm"]
        release.set()
        await holding.read()


async def test_a_server_that_never_comes_is_503_model_not_ready_after_the_wait(upstream):
    """The wait for a started server is bounded ([llama] ready_timeout_s + 10 s), then 503 naming it; nothing stays
    counted. Wrong versions: an endless wait; the member's waiting request left in their count."""
    server, seen, _ = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {"cold-llm": starting()})
    config = catalog(ready_timeout_s=45)
    assert Demand(config, state, None, None).wait_s == 45 + READY_MARGIN_S == 55
    async with opened(state, config) as (client, made):
        made.demand.wait_s = 0.2
        answer = await asyncio.wait_for(client.post("/v1/chat/completions", json=CHAT, headers=HEADERS), 10)
        body = await answer.json()
        assert answer.status == 503 and body["error"]["code"] == "model_not_ready"
        assert "did not start within 0.2 s" in body["error"]["message"] and answer.headers["Retry-After"] == "5"
        assert made.router.in_flight == {} and made.router._watching == {} and seen == []


async def test_a_server_that_fails_to_start_ends_the_wait_at_once_and_the_fallbacks_are_tried(upstream):
    """A state without the alias's server (the runner has not started it yet) keeps the request waiting; one that
    lists it starting, then one without it (it crashed as it loaded), ends the wait: the fallbacks are asked, and
    with none, 503 model_unavailable saying so. Wrong versions: the wait going on to the timeout; a failure read
    from a state that never listed it starting (a request refused before the runner got to it)."""
    server, seen, _ = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {"cold-llm": starting(), "spare-llm": unavailable("none"),
                                                             "warm-llm": unavailable("none")})
    async with opened(state, catalog()) as (client, made):
        asked = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=HEADERS))
        await until(lambda: "cold-llm" in made.router._watching)
        made._update(state.state)  # no server of it yet
        await until(lambda: "cold-llm" in made.router._watching)
        assert not asked.done()
        made._update({**state.state, "servers": [{**state.served, "id": 20, "alias": "cold-llm", "state": "starting",
                                                  "on_demand": "cold-llm"}]})
        await until(lambda: "cold-llm" in made.router._watching)
        assert not asked.done()
        made._update(state.state)  # gone: it crashed
        answer = await asyncio.wait_for(asked, 10)
        body = await answer.json()
        assert answer.status == 503 and body["error"]["code"] == "model_unavailable", body
        assert body["error"]["message"].startswith("cold-llm's server stopped before it was ready")
        assert state.demands == ["cold-llm", "spare-llm", "warm-llm"] and seen == []


async def test_a_client_that_leaves_while_its_model_starts_frees_everything(upstream):
    """Cancelled while it waits for the server: out of the member's count, the router's watchers and the aliases in
    use; the server that comes later gets nothing from it, and a new request is served. Wrong versions: the
    watcher or the count left behind (the member one short of their cap for good)."""
    server, seen, _ = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {"cold-llm": starting()})
    async with opened(state, catalog(max_concurrent_per_user=1)) as (client, made):
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=HEADERS))
        await until(lambda: "cold-llm" in made.router._watching)
        second = await client.post("/v1/chat/completions", json=CHAT, headers=HEADERS)
        assert second.status == 429 and (await second.json())["error"]["code"] == "too_many_requests_per_user"
        waiting.cancel()
        await until(lambda: not made.router._watching and not made.router.in_flight and not made.demand.busy)
        state.serve(made, "cold-llm", 20)
        assert seen == []
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=HEADERS)).status == 200


async def test_aliases_in_use_are_touched_each_flush_and_a_service_away_is_skipped_not_queued(upstream, daemon_log):
    """models_touch carries the catalog aliases with requests in flight or waiting, and those that ended since the
    last touch; nothing used: no call. The service away: logged, and the aliases not kept for later. Wrong versions:
    an alias touched only while in flight (one that ended between two touches never extends its lease); the ended
    ones touched forever; a touch kept and sent again when the service is back; a member's alias (m) touched."""
    server, _, release = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {})
    async with opened(state, catalog()) as (client, made):
        made._update({**state.state, "servers": [state.served, {**state.served, "id": 20, "alias": "cold-llm",
                                                                "on_demand": "cold-llm"}]})
        made._flusher.cancel()  # the test touches
        await made.demand.touch()
        assert state.touches == []
        holding = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=HEADERS)
        await asyncio.wait_for(holding.content.readline(), 10)
        assert (await client.post("/v1/chat/completions", json={**CHAT, "model": "m"}, headers=HEADERS)).status == 200
        await made.demand.touch()
        await made.demand.touch()  # still in flight: touched again
        release.set()
        await holding.read()
        await until(lambda: not made.demand.busy)
        await made.demand.touch()  # ended since the last touch: once more
        await made.demand.touch()  # then no more
        assert state.touches == [["cold-llm"], ["cold-llm"], ["cold-llm"]]
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=HEADERS)).status == 200
        state.away = True
        await made.demand.touch()
        state.away = False
        await made.demand.touch()
        assert state.touches == [["cold-llm"]] * 3
        assert "board gateway: cannot keep cold-llm in use: the board service does not answer" in daemon_log()


async def test_v1_models_lists_the_catalog_cold_ones_too_within_the_keys_scope(upstream):
    """Each catalog alias is listed, cold or not, with board.on_demand true and its state; a member's served alias
    is as before. A key scoped to some aliases sees only those. Wrong versions: the cold aliases left out; the
    key's scope not applied to them; a served catalog alias listed twice."""
    server, _, _ = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {})
    async with opened(state, catalog()) as (client, made):
        servers = [state.served, {**state.served, "id": 20, "alias": "spare-llm", "user": "board-llama",
                                  "on_demand": "spare-llm"}]
        made._update({**state.state, "servers": servers})
        listed = (await (await client.get("/v1/models", headers=HEADERS)).json())["data"]
        assert [(m["id"], m["owned_by"], m["board"].get("on_demand"), m["board"].get("state")) for m in listed] == [
            ("m", "alice", None, None), ("spare-llm", "board-llama", True, "ready"),
            ("cold-llm", "catalog", True, "cold"), ("warm-llm", "catalog", True, "cold"),
            ("hidden-llm", "research", True, "cold")]
        assert listed[2]["board"] == {"servers": [], "cards": [], "booking_end": None, "slots": 0, "on_demand": True,
                                      "state": "cold"}
        state.state["keys"][0]["models"] = ["cold-llm", "m"]
        made._update({**state.state, "servers": servers})
        listed = (await (await client.get("/v1/models", headers=HEADERS)).json())["data"]
        assert [m["id"] for m in listed] == ["m", "cold-llm"]


async def test_cold_starts_are_counted_once_per_booking_and_timed_to_the_ready_server(upstream):
    """board_gateway_cold_starts_total{model} counts a start per new booking (two demands for one booking: one);
    board_gateway_cold_start_seconds{model} is observed once its server takes requests. Wrong versions: each
    model_demand counted; the time observed at the service's reply, or at the next state whatever it lists, rather
    than at the ready server."""
    from prometheus_client.parser import text_string_to_metric_families

    server, _, _ = upstream
    state = Service(str(server.make_url("")).rstrip("/"), {"cold-llm": starting()})
    async with opened(state, catalog()) as (client, made):
        first = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=HEADERS))
        await until(lambda: "cold-llm" in made.router._watching)
        second = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=HEADERS))
        await until(lambda: len(state.demands) == 2 and made.demand.busy["cold-llm"] == 2 and not made.demand.calls)

        def sample(name: str) -> float | None:
            families = text_string_to_metric_families(made.metrics.text().decode())
            return next((s.value for f in families for s in f.samples
                         if s.name == name and s.labels.get("model") == "cold-llm"), None)

        assert sample("board_gateway_cold_starts_total") == 1
        made._update(state.state)  # a new state that does not list it yet: not measured
        assert sample("board_gateway_cold_start_seconds_count") in (None, 0)
        state.serve(made, "cold-llm", 20)
        assert [a.status for a in await asyncio.wait_for(asyncio.gather(first, second), 10)] == [200, 200]
        assert sample("board_gateway_cold_start_seconds_count") == 1

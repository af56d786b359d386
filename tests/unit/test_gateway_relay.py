"""The gateway's relay in process (app.gateway.server), against an aiohttp upstream that records what it gets:
the server's own API key goes upstream and the client's does not, a stream is relayed before the upstream has
finished it (never buffered), prompts stay out of the log, and tokens are counted from `usage`.
tests/llama/test_gateway.py does the same end to end with a real llama-server and the openai client."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.config import Config, GatewaySettings
from app.core.keys import key_hash
from app.gateway.server import Gateway

KEY = "bk-client-key"


class FixedState:
    """The service's socket: one gateway_state, no events; accounting batches kept for the test."""
    path = "(test)"

    def __init__(self, upstream: str, parallel: int = 4) -> None:
        self.state = {"servers": [{"id": 7, "alias": "m", "url": upstream, "api_key": "srv-secret", "parallel": parallel,
                                   "user": "alice", "booking": 3, "booking_end": None, "cards": [0], "state": "ready"}],
                      "planned": [], "keys": [{"id": 1, "hash": key_hash(KEY), "user": "bob", "models": None,
                                               "class": "batch", "expires": None, "revoked": None,
                                               "fingerprint": "fp"}]}
        self.usage: list[dict] = []
        self.closed = threading.Event()

    def call(self, op, **args):
        if op == "gateway_usage":
            self.usage.extend(args["records"])
            return {"recorded": len(args["records"])}
        return self.state

    def subscribe(self, kinds):
        self.closed.wait()
        return iter(())

    def close(self):
        self.closed.set()


@pytest.fixture
async def upstream():
    seen: list[dict] = []
    release = asyncio.Event()

    async def chat(request):
        body = await request.json()
        seen.append({"authorization": request.headers.get("Authorization"), "body": body})
        if not body.get("stream"):
            return web.json_response({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 4}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"delta":{"content":"first"}}]}\n\n')
        await release.wait()  # the rest only once the client has seen the first chunk
        await response.write(b'data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":9}}\n\n'
                             b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = TestServer(app)
    await server.start_server()
    yield server, seen, release
    release.set()
    await server.close()


@pytest.fixture
async def gateway(upstream):
    server, _, _ = upstream
    state = FixedState(str(server.make_url("")).rstrip("/"))
    made = Gateway(Config(gateway=GatewaySettings()), state)
    client = TestClient(TestServer(made.app()))
    await client.start_server()
    while not made.router.known:
        await asyncio.sleep(0.01)
    yield client, made, state
    await client.close()


async def test_the_servers_key_goes_upstream_and_the_clients_does_not(gateway, upstream, capsys):
    client, made, state = gateway
    _, seen, _ = upstream
    answer = await client.post("/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "user", "content": "my secret prompt"}]}, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status == 200 and (await answer.json())["usage"]["completion_tokens"] == 4
    assert seen[-1]["authorization"] == "Bearer srv-secret"
    await made._flush()
    [record] = state.usage
    assert (record["user"], record["fingerprint"], record["model"], record["server_id"], record["status"],
            record["prompt_tokens"], record["completion_tokens"]) == ("bob", "fp", "m", 7, 200, 11, 4)
    logged = capsys.readouterr().err
    assert "user=bob" in logged and "secret prompt" not in logged and KEY not in logged


async def test_a_stream_is_relayed_before_the_upstream_has_finished_it(gateway, upstream):
    client, made, state = gateway
    _, _, release = upstream
    answer = await client.post("/v1/chat/completions", json={"model": "m", "stream": True, "messages": []},
                               headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status == 200 and answer.headers["Content-Type"] == "text/event-stream"
    first = await asyncio.wait_for(answer.content.readline(), 10)  # the upstream is still holding the rest
    assert json.loads(first[6:])["choices"][0]["delta"]["content"] == "first"
    release.set()
    rest = await answer.content.read()
    assert rest.rstrip().endswith(b"data: [DONE]")
    await made._flush()
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in state.usage] == [(2, 9)]


async def test_errors_are_in_openais_shape(gateway):
    client, _, _ = gateway
    answer = await client.post("/v1/chat/completions", json={"model": "m"})
    assert answer.status == 401 and set((await answer.json())["error"]) == {"message", "type", "code"}
    answer = await client.post("/v1/chat/completions", data=b"not json", headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status == 400 and (await answer.json())["error"]["code"] == "invalid_json"
    answer = await client.post("/v1/chat/completions", json={"model": "x"}, headers={"Authorization": f"Bearer {KEY}"})
    body = await answer.json()
    assert answer.status == 404 and "served now: m" in body["error"]["message"]
    models = await (await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})).json()
    assert [(m["id"], m["owned_by"], m["board"]["servers"]) for m in models["data"]] == [("m", "alice", [7])]


@pytest.mark.parametrize("body", [b"", b'{"messages": []}', b'{"model": ""}', b'{"model": 5}', b'{"model": ["m"]}',
                                  b'{"model": null}', b'[{"model": "m"}]', b'"m"'],
                         ids=["empty", "none", "blank", "number", "list", "null", "array", "string"])
async def test_a_request_that_names_no_model_is_400_and_goes_nowhere(gateway, upstream, body):
    """Nearest wrong versions:
    - a blank "model" taken as a name: 404 (no such model) instead of "say which model"
    - a model that is not a string passed on: 500, or routed by its repr
    - a JSON body that is not an object read with .get: 500"""
    client, made, state = gateway
    _, seen, _ = upstream
    answer = await client.post("/v1/chat/completions", data=body, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status == 400 and (await answer.json())["error"]["code"] == "model_required"
    assert seen == []


async def test_json_nested_past_the_recursion_limit_is_400(gateway, upstream):
    """Nearest wrong version: RecursionError not caught: 500 and a traceback."""
    client, _, _ = gateway
    _, seen, _ = upstream
    answer = await client.post("/v1/chat/completions", data=b"[" * 100_000 + b"]" * 100_000,
                               headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status == 400 and (await answer.json())["error"]["code"] == "invalid_json"
    assert seen == []

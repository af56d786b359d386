"""The gateway's relay in process (app.gateway.server), against an aiohttp upstream that records what it gets:
the server's own API key goes upstream and the client's does not, a stream is relayed before the upstream has
finished it (never buffered), prompts stay out of the log, and tokens are counted from `usage`.
tests/llama/test_gateway.py does the same end to end with a real llama-server and the openai client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from app.config import Config, GatewaySettings
from app.core.keys import key_hash
from app.errors import BadInput, ServiceDown
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
        if op != "gateway_state":
            raise BadInput(f"unknown operation {op!r}")  # as the service answers one it does not have
        return self.state

    def subscribe(self, kinds):
        self.kinds = tuple(kinds)
        self.closed.wait()
        return iter(())

    def close(self):
        self.closed.set()


@contextlib.asynccontextmanager
async def opened(state, config: Config | None = None, **settings):
    """A gateway on `state` (and `config`, else one of these [gateway] settings), listening for a test client, once
    it has read the state: (client, gateway)."""
    made = Gateway(config or Config(gateway=GatewaySettings(**settings)), state)
    client = TestClient(TestServer(made.app()))
    await client.start_server()
    try:
        while not made.router.known:
            await asyncio.sleep(0.01)
        yield client, made
    finally:
        await client.close()


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
    async with opened(state) as (client, made):
        yield client, made, state


async def test_the_servers_key_goes_upstream_and_the_clients_does_not(gateway, upstream, daemon_log):
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
    logged = daemon_log()
    assert "user=bob" in logged and "secret prompt" not in logged and KEY not in logged


async def test_the_drain_and_the_queues_wait_are_the_ones_the_settings_give(upstream):
    """[gateway] drain_s and queue_timeout_s reach the routing: a request waiting for a busy server's only slot is
    refused once queue_timeout_s has passed (429, naming it), and a server whose booking ends within drain_s (40 s
    left: within 45, not within the default 30) gets no request (503, naming it).
    Wrong versions: either setting not handed to the routing (the default's 30 s, or none: an endless wait)."""
    server, _, release = upstream
    state = FixedState(str(server.make_url("")).rstrip("/"), parallel=1)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with opened(state, queue_timeout_s=0.2) as (client, _):
        holding = await client.post("/v1/chat/completions", json={"model": "m", "stream": True, "messages": []},
                                    headers=headers)
        await asyncio.wait_for(holding.content.readline(), 10)  # the one slot is taken until the stream ends
        waited = await asyncio.wait_for(client.post("/v1/chat/completions", json={"model": "m", "messages": []},
                                                    headers=headers), 10)
        assert waited.status == 429 and "the wait passed 0.2 s" in (await waited.json())["error"]["message"]
        release.set()
        await holding.read()
    state.state["servers"][0]["booking_end"] = int(time.time()) + 40
    async with opened(state, drain_s=45) as (client, _):
        answer = await client.post("/v1/chat/completions", json={"model": "m", "messages": []}, headers=headers)
        assert answer.status == 503 and "within 45 s" in (await answer.json())["error"]["message"]


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


class AwayState(FixedState):
    """FixedState whose service is away for the next `away` gateway_usage calls (ServiceDown, as the socket client
    says it), or refuses them (`refuse`: BadInput, as the service answers a batch it will not take). While `hold` is
    set, a call waits for it to clear (`entered` says it is out), so the test can account a request meanwhile."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.away, self.refuse, self.calls = 0, 0, 0
        self.entered, self.hold = threading.Event(), threading.Event()

    def call(self, op, **args):
        if op != "gateway_usage":
            return super().call(op, **args)
        self.calls += 1
        self.entered.set()
        while self.hold.is_set():
            self.closed.wait(0.01)
        if self.away:
            self.away -= 1
            raise ServiceDown("the board service is not running (systemctl status board-agent)")
        if self.refuse:
            self.refuse -= 1
            raise BadInput("gateway_usage: prompt_tokens must be a whole number")
        return super().call(op, **args)


@pytest.fixture
async def away(upstream):
    """The gateway of `gateway`, on an AwayState, with its once-a-second flush stopped: the test flushes."""
    server, _, _ = upstream
    state = AwayState(str(server.make_url("")).rstrip("/"))
    async with opened(state) as (client, made):
        made._flusher.cancel()
        yield client, made, state
        state.away = state.refuse = 0
        state.hold.clear()


async def asked(client, model: str) -> int:
    """One request as bob for `model`; its status (200 for m, 404 for any other: both accounted)."""
    answer = await client.post("/v1/chat/completions", json={"model": model, "messages": []},
                               headers={"Authorization": f"Bearer {KEY}"})
    await answer.read()
    return answer.status


def sent(state) -> list[tuple[str, int]]:
    return [(r["model"], r["status"]) for r in state.usage]


async def test_accounting_while_the_service_is_away_is_kept_in_order_and_sent_once_when_it_is_back(away, daemon_log):
    """The service away at a flush: its batch is kept ahead of what was accounted while it was out, nothing is sent
    again at once (the next flush, a second later, tries again), and once the service is back each record arrives
    once, in the order of the requests.
    Wrong versions: the failed batch dropped; kept behind the records that came in meanwhile; tried again at once in
    the same flush (a hot loop while the service is away)."""
    client, made, state = away
    assert [await asked(client, m) for m in ("m", "x", "m")] == [200, 404, 200]
    state.away = 1
    state.hold.set()
    flush = asyncio.create_task(made._flush())
    await asyncio.get_running_loop().run_in_executor(None, state.entered.wait, 10)
    assert await asked(client, "y") == 404  # accounted while the batch is out
    state.hold.clear()
    await flush
    assert state.calls == 1 and state.usage == []
    assert [(r["model"], r["status"]) for r in made.pending] == [("m", 200), ("other", 404), ("m", 200), ("other", 404)]
    assert ("board gateway: accounting kept for later (4 records): the board service is not running (systemctl"
            " status board-agent)\n") in daemon_log()
    await made._flush()  # the service is back
    await made._flush()
    assert state.calls == 2 and made.pending == []
    assert sent(state) == [("m", 200), ("other", 404), ("m", 200), ("other", 404)]


async def test_accounting_kept_while_the_service_is_away_stops_at_max_pending(away, monkeypatch):
    """At most MAX_PENDING records are kept while the service is away, whether they come from requests or from a batch
    that failed: the cap's last record is kept, the next is not, and a failed batch is put back only as far as the
    records that came in meanwhile leave room.
    Wrong versions: the cap moved by one (< against <=); a failed batch put back whole past the cap."""
    import app.gateway.server as gateway_server

    monkeypatch.setattr(gateway_server, "MAX_PENDING", 3)
    client, made, state = away
    state.away = 2
    for model in ("m", "x", "m", "y"):
        await asked(client, model)
    assert [r["model"] for r in made.pending] == ["m", "other", "m"]  # the fourth over the cap: not kept
    state.hold.set()
    flush = asyncio.create_task(made._flush())
    await asyncio.get_running_loop().run_in_executor(None, state.entered.wait, 10)
    await asked(client, "z")  # the batch is out: room for it
    state.hold.clear()
    await flush
    assert len(made.pending) == 3 and made.pending[-1]["status"] == 404
    assert [r["status"] for r in made.pending] == [200, 404, 404]  # the batch's first two, then the newcomer
    await made._flush()
    assert len(made.pending) == 3 and state.usage == []
    await made._flush()
    assert made.pending == [] and [r["status"] for r in state.usage] == [200, 404, 404]


async def test_a_batch_the_service_refuses_is_not_kept_and_the_accounting_behind_it_goes_on(away, upstream, daemon_log):
    """A batch the service refuses (BadInput: a record it will not take, such as the negative token count an upstream
    sent) would be refused again at every flush: it is dropped, said in the log, and the next records are sent. Only a
    service that is away keeps its batch.
    Wrong versions: a refused batch kept like one the service never got (every flush sends it again, refused again,
    and the records behind it never arrive); dropped in silence."""
    client, made, state = away
    await asked(client, "m")
    state.refuse = 1
    await made._flush()
    assert state.calls == 1 and made.pending == []
    assert "accounting refused by the service, 1 records dropped: gateway_usage: prompt_tokens" in daemon_log()
    await asked(client, "x")
    await made._flush()
    assert state.calls == 2 and sent(state) == [("other", 404)]


async def test_more_records_than_one_batch_go_in_batches_the_service_takes_none_lost_or_sent_twice(away):
    """The service takes at most MAX_BATCH records a call (it refuses more as BadInput, which would now drop them): a
    flush with one record more sends a full batch, then the one, each record once and in order.
    Wrong versions: a batch one record too large (refused, so dropped); the slices overlapping or leaving a record
    between them."""
    from app.service.ops.gateway import MAX_BATCH

    client, made, state = away
    taken: list[int] = []

    def usage(op, **args):
        if op == "gateway_usage":
            if len(args["records"]) > MAX_BATCH:
                raise BadInput(f"gateway_usage: at most {MAX_BATCH} records at once")
            taken.append(len(args["records"]))
        return FixedState.call(state, op, **args)

    state.call = usage
    for n in range(MAX_BATCH + 1):
        await asked(client, "m" if n % 3 else "x")
    assert [r["status"] for r in made.pending] == [404 if n % 3 == 0 else 200 for n in range(MAX_BATCH + 1)]
    expected = list(made.pending)
    await made._flush()
    assert taken == [MAX_BATCH, 1] and made.pending == [] and state.usage == expected


class FollowedState(FixedState):
    """FixedState whose events the test sends (`send`), with gateway_state failing while `away` is set. `send` returns
    once the gateway has taken the event in hand and asked for the next one."""

    def __init__(self, upstream: str) -> None:
        import queue

        super().__init__(upstream)
        self.away = False
        self.events: queue.Queue = queue.Queue()
        self.taken = threading.Semaphore(0)

    def call(self, op, **args):
        if op == "gateway_state" and self.away:
            raise ServiceDown("the board service is not running (systemctl status board-agent)")
        return super().call(op, **args)

    def subscribe(self, kinds):
        self.kinds = tuple(kinds)
        while (event := self.events.get()) is not None:
            yield event
            self.taken.release()

    def close(self):
        self.events.put(None)

    async def send(self, event: dict) -> None:
        self.events.put(event)
        taken = await asyncio.get_running_loop().run_in_executor(None, self.taken.acquire, True, 10)
        assert taken, f"the gateway stopped following the service at {event}"
        await asyncio.sleep(0)  # the router's update, handed to the loop, runs


def test_a_state_read_as_the_gateway_stops_is_dropped_and_the_following_ends_quietly():
    """The service's state arrives after the gateway stopped and its loop closed: the follower drops it and ends.
    Wrong version: the state handed to the closed loop anyway (a RuntimeError in the follower's thread at a stop)."""
    made = Gateway(Config(), FixedState("http://127.0.0.1:9"))
    loop = asyncio.new_event_loop()
    loop.close()
    made.client.close()  # the service sends no event after this read
    made._follow(loop)
    assert not made.router.known


async def test_the_last_state_stands_while_the_service_is_away_and_is_read_again_when_it_is_back(upstream, daemon_log):
    """The service goes away and a change comes in while its state cannot be read: the gateway routes on the last state
    it read (bob's key still works) and goes on following; back (`reconnected`), its state is read again and the key
    revoked meanwhile is refused. The log says the service was lost.
    Wrong versions: the log line changed or left out; a failed read ends the following (or empties the routing);
    `reconnected` not read again (a key revoked while the service restarted keeps working); another operation asked
    for than gateway_state, or other events followed than the gateway's."""
    server, _, _ = upstream
    state = FollowedState(str(server.make_url("")).rstrip("/"))
    async with opened(state) as (client, _):
        assert await asked(client, "m") == 200
        await state.send({"event": "down", "message": "the board service is not running"})
        assert ("board gateway: lost the service (the board service is not running); routing on the last state until"
                " it is back\n") in daemon_log()
        state.away = True
        await state.send({"event": "gateway"})
        assert await asked(client, "m") == 200
        assert "cannot read the service's state: the board service is not running" in daemon_log()
        state.state = {**state.state, "keys": []}  # bob's key revoked while the service was away
        state.away = False
        await state.send({"event": "reconnected"})
        assert await asked(client, "m") == 401
    assert state.kinds == ("gateway",)  # the events it follows: only the gateway's


async def test_a_batch_whose_reply_was_lost_after_the_commit_is_sent_again_and_recorded_once(away, tmp_path):
    """The service committed a batch, then its reply was lost (it stopped, or answered after the client gave up): the
    gateway keeps the batch as if the service had been away and sends it again; the real service records each request
    once, by the id the gateway gave it, and the records that came in meanwhile once each too.
    Wrong versions: records sent without an id (counted twice); one id for a whole gateway (every record after the
    first skipped); ids that repeat within one gateway."""
    from app.gpu import open_source
    from app.gpu.fleet import Fleet
    from app.service import Service
    from tests.conftest import FROZEN_NOW
    from tests.unit.test_gateway_keys import GATEWAY

    client, made, state = away
    service = Service(Config(db_path=tmp_path / "board.db"), Fleet(open_source(True, clock=lambda: FROZEN_NOW), 1.0),
                      clock=lambda: FROZEN_NOW)
    lose = [1]

    def usage(op, **args):
        if op != "gateway_usage":
            return FixedState.call(state, op, **args)
        answer = service.call(GATEWAY, op, args)
        if lose[0]:
            lose[0] -= 1
            raise ServiceDown("the board service is not running (systemctl status board-agent)")
        return answer

    state.call = usage
    try:
        for model in ("m", "x", "m"):
            await asked(client, model)
        await made._flush()
        assert len(made.pending) == 3  # kept: the gateway cannot tell a lost reply from a service away
        await asked(client, "y")
        await made._flush()
        assert made.pending == []
        recorded = service.conn.execute("SELECT request, model, status FROM gateway_usage ORDER BY id").fetchall()
    finally:
        service.close()
    assert [(m, s) for _, m, s in recorded] == [("m", 200), ("other", 404), ("m", 200), ("other", 404)]
    assert len({r for r, _, _ in recorded}) == 4 and all(r for r, _, _ in recorded)


async def test_a_keys_models_list_only_what_it_may_use_and_an_open_key_lists_all(upstream):
    """GET /v1/models answers each key with the models it may use: a key scoped to n does not learn that m is served.
    Wrong versions: the scope ignored in the listing (every alias shown to every key); the scope applied to the
    open key (nothing listed)."""
    server, _, _ = upstream
    state = FixedState(str(server.make_url("")).rstrip("/"))
    state.state["servers"].append({**state.state["servers"][0], "id": 8, "alias": "n", "cards": [1]})
    state.state["keys"].append({**state.state["keys"][0], "id": 2, "hash": key_hash("bk-scoped"), "models": ["n"],
                                "fingerprint": "fp2"})
    async with opened(state) as (client, _):
        async def listed(key: str) -> list[str]:
            answer = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            return [m["id"] for m in (await answer.json())["data"]]

        assert await listed("bk-scoped") == ["n"]
        assert await listed(KEY) == ["m", "n"]


@pytest.mark.parametrize("extra, status", [(0, 200), (1, 413)], ids=["at-the-limit", "a-byte-over"])
async def test_a_body_of_exactly_max_body_mb_is_relayed_and_a_byte_more_is_413(upstream, extra, status):
    """[gateway] max_body_mb is the largest body relayed. Wrong version: the limit itself refused (>= for >). (A check a
    byte late is refused alike by aiohttp's client_max_size, which is set to the same limit.)"""
    server, seen, _ = upstream
    state = FixedState(str(server.make_url("")).rstrip("/"))
    async with opened(state, max_body_mb=1 / 1024) as (client, _):  # 1,024 bytes
        head = b'{"model": "m", "messages": [], "pad": "'
        body = head + b"x" * (1024 - len(head) - 2 + extra) + b'"}'
        answer = await client.post("/v1/chat/completions", data=body, headers={
            "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        await answer.read()
    assert answer.status == status and len(body) == 1024 + extra
    assert len(seen) == (1 if status == 200 else 0)


async def test_each_upstream_request_has_its_own_connection_so_a_dropped_kept_alive_one_is_never_met():
    """An upstream that drops a kept-alive connection when a second request comes on it (as llama-server's
    cpp-httplib drops its kept-alive connections when it likes) never fails a member's request: the gateway opens a
    connection per upstream request.
    Wrong version: connections pooled and reused (aiohttp's default): the second request is a 502
    (ServerDisconnectedError)."""
    connections: list[int] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        answered = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            if answered:  # a request on a kept-alive connection: dropped unanswered
                writer.close()
                return
            body = b'{"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            answered += 1

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    made = Gateway(Config(gateway=GatewaySettings()), FixedState(f"http://127.0.0.1:{port}"))
    made._recheck_loop = asyncio.Event().wait  # no /health probes: only the members' requests reach the upstream
    client = TestClient(TestServer(made.app()))
    await client.start_server()
    try:
        while not made.router.known:
            await asyncio.sleep(0.01)
        statuses = [await asked(client, "m") for _ in range(3)]
    finally:
        await client.close()
        server.close()
    assert statuses == [200, 200, 200]
    assert len(connections) == 3


class NeverState(FixedState):
    """A service that never answers gateway_state: the gateway has not read its state yet."""

    def call(self, op, **args):
        raise ServiceDown("the service is not running (test)")


async def test_health_says_starting_503_until_the_state_is_read_then_ok_200_with_the_models_and_servers(upstream):
    """/health is what a load balancer and `board gateway`'s unit read: before the service's state is read it is
    503 "starting" (and a keyed request is told to retry in 5 s), after it 200 "ok" with the served aliases, sorted,
    and the server count. Wrong versions: 200 (or 504) before the state; any key renamed; no Retry-After on a
    refusal that says when to retry, or one ("None") on a refusal that does not."""
    made = Gateway(Config(gateway=GatewaySettings()), NeverState("http://127.0.0.1:9"))
    client = TestClient(TestServer(made.app()))
    await client.start_server()
    try:
        answer = await client.get("/health")
        assert answer.status == 503
        assert await answer.json() == {"status": "starting", "service": False, "models": [], "servers": 0}
        answer = await client.post("/v1/chat/completions", json={"model": "m"}, headers={"Authorization": f"Bearer {KEY}"})
        assert answer.status == 503 and answer.headers["Retry-After"] == "5"
        assert (await answer.json())["error"]["code"] == "service_unavailable"
    finally:
        await client.close()
    server, _, _ = upstream
    state = FixedState(str(server.make_url("")).rstrip("/"))
    state.state["servers"] += [{**state.state["servers"][0], "id": 8, "alias": "a"},
                               {**state.state["servers"][0], "id": 9, "alias": "m"}]
    async with opened(state) as (client, _):
        answer = await client.get("/health")
        assert answer.status == 200
        assert await answer.json() == {"status": "ok", "service": True, "models": ["a", "m"], "servers": 3}
        answer = await client.post("/v1/chat/completions", json={"model": "m"})
        assert answer.status == 401 and "Retry-After" not in answer.headers


async def test_an_upstream_that_refuses_is_502_with_retry_after_1(daemon_log):
    """A server whose llama-server is gone: 502 upstream_unavailable, saying which server and how, with Retry-After: 1
    (the request goes to another server, or to this one once it is back), and the log says it leaves the routing.
    Wrong versions: the header left out; the message, type or code changed; the log line changed."""
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    async with opened(FixedState(f"http://127.0.0.1:{port}")) as (client, _):
        answer = await client.post("/v1/chat/completions", json={"model": "m"}, headers={"Authorization": f"Bearer {KEY}"})
        assert answer.status == 502 and answer.headers["Retry-After"] == "1"
        assert await answer.json() == {"error": {"message": "server 7 (m) did not answer: ClientConnectorError",
                                                 "type": "server_error", "code": "upstream_unavailable"}}
    assert ("board gateway: server 7 (m) refused the connection: not routed until it answers\n"
            in daemon_log())


async def test_v1_models_is_openais_list_with_the_boards_servers_cards_latest_booking_end_and_slots(upstream):
    """GET /v1/models in OpenAI's shape ({"object": "list", "data": [{"id", "object": "model", "created": 0,
    "owned_by"}]}, which clients parse), and the board's own part per alias: its servers, their cards sorted, the
    latest end of their bookings (None when none has one), the slots of all its servers.
    Wrong versions: a key renamed or a constant changed; booking_end from the servers without one, or always None."""
    server, _, _ = upstream
    state = FixedState(str(server.make_url("")).rstrip("/"))
    first = state.state["servers"][0]
    state.state["servers"] = [{**first, "cards": [3, 1], "booking_end": 1_900_000_000},
                              {**first, "id": 8, "cards": [0], "parallel": 2, "booking_end": None},
                              {**first, "id": 9, "cards": [2], "parallel": 1, "booking_end": 1_800_000_000},
                              {**first, "id": 10, "alias": "n", "user": "carol", "cards": [5]}]
    async with opened(state) as (client, _):
        answer = await client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert await answer.json() == {"object": "list", "data": [
            {"id": "m", "object": "model", "created": 0, "owned_by": "alice",
             "board": {"servers": [7, 8, 9], "cards": [0, 1, 2, 3], "booking_end": 1_900_000_000, "slots": 7}},
            {"id": "n", "object": "model", "created": 0, "owned_by": "carol",
             "board": {"servers": [10], "cards": [5], "booking_end": None, "slots": 4}}]}


async def test_metrics_count_requests_tokens_and_times_by_user_model_and_status(upstream, daemon_log):
    """The gateway's own /metrics, as Prometheus parses it: requests by user, model and status (a planned alias by
    its name, an unknown one as "other", a request without a key with neither), tokens by user and model, the
    latency and time to first byte by model in the documented buckets (a request refused before any upstream answer
    has no first byte), the waiting requests now.
    Each request is also a line of the gateway's log.
    Wrong versions: a counter, label, bucket or help text changed or dropped; tokens counted for a refusal; a time
    observed under another model; a planned alias counted as "other"; the log line's fields changed."""
    import re
    import time

    from prometheus_client.parser import text_string_to_metric_families

    server, _, release = upstream
    release.set()
    state = FixedState(str(server.make_url("")).rstrip("/"))
    state.state["planned"] = [{"alias": "team", "booking": 42, "start": time.time() + 3600, "end": time.time() + 7200,
                               "user": "alice"}]
    auth = {"Authorization": f"Bearer {KEY}"}
    async with opened(state) as (client, _):
        for body in ({"model": "m"}, {"model": "m", "stream": True}, {"model": "x"}, {"model": "team"}):
            await (await client.post("/v1/chat/completions", json=body, headers=auth)).read()
        await (await client.post("/v1/chat/completions", json={"model": "m"})).read()
        answer = await client.get("/metrics")
        assert answer.headers["Content-Type"] == "text/plain; charset=utf-8"
        families = {f.name: f for f in text_string_to_metric_families(await answer.text())}
    logged = sorted(re.sub(r" \d+ms$", " Nms", line) for line in daemon_log().splitlines()
              if line.startswith("board gateway: POST"))
    assert logged == sorted(f"board gateway: POST /v1/chat/completions {fields} Nms" for fields in (
        "200 model=m user=bob key=fp server=7 tokens=11+4", "200 model=m user=bob key=fp server=7 tokens=2+9",
        "404 model=other user=bob key=fp server=- tokens=0+0", "503 model=team user=bob key=fp server=- tokens=0+0",
        "401 model=- user=- key=- server=- tokens=0+0"))
    docs = {name: (f.type, f.documentation) for name, f in families.items()
            if name.startswith("board_gateway") and not name.endswith("_created")}
    assert docs == {
        "board_gateway_requests": ("counter", "Requests answered, by user, model and HTTP status"),
        "board_gateway_prompt_tokens": ("counter", "Prompt tokens, by user and model"),
        "board_gateway_completion_tokens": ("counter", "Completion tokens, by user and model"),
        "board_gateway_request_duration_seconds": ("histogram", "From the request to the answer's end"),
        "board_gateway_waiting_requests": ("gauge", "Requests waiting for a free slot now"),
        "board_gateway_time_to_first_token_seconds": ("histogram", "From the request to the first byte back"),
        "board_gateway_cold_starts": ("counter", "Catalog models started for a request, by alias"),
        "board_gateway_cold_start_seconds": ("histogram", "From asking the service to start a catalog model to its"
                                                          " server taking requests")}

    def samples(name: str, suffix: str = "_total") -> dict:
        return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples if s.name == name + suffix}

    assert samples("board_gateway_requests") == {
        (("code", "200"), ("model", "m"), ("user", "bob")): 2, (("code", "404"), ("model", "other"), ("user", "bob")): 1,
        (("code", "503"), ("model", "team"), ("user", "bob")): 1, (("code", "401"), ("model", ""), ("user", "")): 1}
    bob = (("model", "m"), ("user", "bob")), (("model", "other"), ("user", "bob")), (("model", "team"), ("user", "bob"))
    assert samples("board_gateway_prompt_tokens") == dict(zip(bob, (13, 0, 0)))
    assert samples("board_gateway_completion_tokens") == dict(zip(bob, (13, 0, 0)))
    assert samples("board_gateway_request_duration_seconds", "_count") == {
        (("model", "m"),): 2, (("model", "other"),): 1, (("model", "team"),): 1}
    assert samples("board_gateway_time_to_first_token_seconds", "_count") == {(("model", "m"),): 2}
    assert samples("board_gateway_waiting_requests", "") == {(): 0}
    for name in ("board_gateway_request_duration_seconds", "board_gateway_time_to_first_token_seconds"):
        bounds = [s.labels["le"] for s in families[name].samples
                  if s.name == name + "_bucket" and s.labels["model"] == "m"]
        assert bounds == ["0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "30.0", "60.0", "120.0", "300.0",
                          "+Inf"]


async def test_each_answer_is_one_accounting_record_with_its_times_and_an_id_unique_across_restarts(upstream):
    """The record the service keeps per request (gateway_usage): when, which key, user, model, server and status,
    the tokens, the time to the first byte and in all in milliseconds (none to the first byte for a refusal before
    any upstream answer), and an id of the gateway's start and a count, so a batch sent twice is recorded once.
    Wrong versions: a field left out, renamed or taken from elsewhere; seconds for milliseconds; the count not
    going up by one from 1; the same start id for two gateways."""
    import re
    import time

    server, _, release = upstream
    release.set()
    state = FixedState(str(server.make_url("")).rstrip("/"))
    before = int(time.time())
    async with opened(state) as (client, made):
        for body in ({"model": "m"}, {"model": "m", "stream": True}, {"model": "x"}):
            await (await client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})).read()
        await made._flush()
        boot = made._boot
    async with opened(FixedState(str(server.make_url("")).rstrip("/"))) as (_, other):
        assert other._boot != boot
    after = int(time.time())
    assert [set(r) for r in state.usage] == [{"ts", "key_id", "fingerprint", "user", "model", "server_id", "status",
                                             "prompt_tokens", "completion_tokens", "ttft_ms", "duration_ms",
                                             "request"}] * 3
    assert sorted(r["request"] for r in state.usage) == [f"{boot}-1", f"{boot}-2", f"{boot}-3"]
    assert re.fullmatch(r"[0-9a-f]{16}", boot)
    summary = sorted((r["status"], r["model"], r["server_id"], r["key_id"], r["fingerprint"], r["user"],
                      r["prompt_tokens"], r["completion_tokens"], r["ttft_ms"] is None) for r in state.usage)
    assert summary == [(200, "m", 7, 1, "fp", "bob", 2, 9, False), (200, "m", 7, 1, "fp", "bob", 11, 4, False),
                       (404, "other", None, 1, "fp", "bob", 0, 0, True)]
    for record in state.usage:
        assert before <= record["ts"] <= after and isinstance(record["ts"], int)
        assert isinstance(record["duration_ms"], int) and 0 <= record["duration_ms"] < (after - before + 1) * 1000
        if record["ttft_ms"] is not None:
            assert isinstance(record["ttft_ms"], int) and 0 <= record["ttft_ms"] <= record["duration_ms"]


async def test_log_bodies_logs_each_request_body_up_to_4096_bytes_by_key_fingerprint(upstream, daemon_log):
    """[gateway] log_bodies: the body goes to the log under the key's fingerprint, cut at 4,096 bytes; off (the
    default), no body is logged; a character the cut splits is shown as U+FFFD. Wrong versions: the cut moved; the
    fingerprint left out; logged when off; the split character failing the request (strict decoding)."""
    server, _, _ = upstream
    head = b'{"model": "m", "messages": [{"role": "user", "content": "'
    body = head + b"y" * (4095 - len(head)) + "é".encode() + b"y" * 1000 + b'"}]}'  # é's two bytes: 4,096th and next
    for setting in (True, False):
        async with opened(FixedState(str(server.make_url("")).rstrip("/")), log_bodies=setting) as (client, _):
            answer = await client.post("/v1/chat/completions", data=body, headers={"Authorization": f"Bearer {KEY}"})
            assert answer.status == 200
        lines = [line for line in daemon_log().splitlines() if "request body" in line]
        cut = body[:4095].decode() + "\ufffd"
        assert lines == ([f"board gateway: request body (fp): {cut!r}"] if setting else [])


async def test_what_goes_upstream_and_what_comes_back_in_the_headers():
    """Upstream: the route's own path and method, the body, Content-Type and Accept from the client, the server's
    own key, and nothing else of the client's (cookies, its key). Back: the upstream's status and Content-Type (JSON
    when it says none), its Content-Length for a whole answer, and for a stream no-cache and no buffering by a proxy.
    Wrong versions: a header left out, renamed or changed; the client's other headers passed on; no key sent
    upstream for a server that has one, or one sent for a server without."""
    seen: list[tuple[str, str, dict, bytes]] = []

    async def answer(request):
        seen.append((request.method, request.path, dict(request.headers), await request.read()))
        body = await request.json()
        if body.get("stream"):
            response = web.StreamResponse(status=201, headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"data: [DONE]\n\n")
            return response
        return web.Response(status=203, body=b'{"ok": 2}', content_type="application/x-test")

    async def bare(reader, writer):  # an answer with no Content-Type at all (aiohttp's server always sends one)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")).split(b":")[1])
        headers = dict(line.decode().split(": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
        seen.append((head.split()[0].decode(), head.split()[1].decode(), headers, await reader.readexactly(length)))
        writer.write(b'HTTP/1.1 202 Accepted\r\nContent-Length: 9\r\nConnection: close\r\n\r\n{"ok": 1}')
        await writer.drain()
        writer.close()

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    server = TestServer(app)
    await server.start_server()
    raw_server = await asyncio.start_server(bare, "127.0.0.1", 0)
    state = FixedState(str(server.make_url("")).rstrip("/"))
    state.state["servers"].append({**state.state["servers"][0], "id": 8, "alias": "open", "api_key": None,
                                   "url": f"http://127.0.0.1:{raw_server.sockets[0].getsockname()[1]}"})
    try:
        async with opened(state) as (client, _):
            sent = {"Authorization": f"Bearer {KEY}", "Accept": "text/x-mine", "Cookie": "c=1", "X-Other": "o",
                    "Content-Type": "application/json"}
            plain = await client.post("/v1/completions", data=b'{"model": "m"}', headers=sent)
            assert (plain.status, plain.headers["Content-Type"], plain.headers["Content-Length"]) == (
                203, "application/x-test", "9")
            assert await plain.read() == b'{"ok": 2}' and "Cache-Control" not in plain.headers
            stream = await client.post("/v1/completions", data=b'{"model": "m", "stream": true}', headers=sent)
            assert (stream.status, stream.headers["Content-Type"], stream.headers["Cache-Control"],
                    stream.headers["X-Accel-Buffering"]) == (201, "text/event-stream", "no-cache", "no")
            assert await stream.read() == b"data: [DONE]\n\n"
            bare = await client.post("/v1/completions", data=b'{"model": "open", "bare": 1}', headers=sent)
            assert (bare.status, bare.headers["Content-Type"]) == (202, "application/json")
            assert await bare.read() == b'{"ok": 1}'
    finally:
        await server.close()
        raw_server.close()
    assert [(m, p, b) for m, p, _, b in seen] == [("POST", "/v1/completions", b'{"model": "m"}'),
                                                  ("POST", "/v1/completions", b'{"model": "m", "stream": true}'),
                                                  ("POST", "/v1/completions", b'{"model": "open", "bare": 1}')]
    for _, _, headers, _ in seen:
        assert headers["Accept"] == "text/x-mine" and headers["Content-Type"] == "application/json"
        assert "Cookie" not in headers and "X-Other" not in headers
    assert [headers.get("Authorization") for _, _, headers, _ in seen] == ["Bearer srv-secret"] * 2 + [None]


async def test_an_upstream_that_compresses_when_asked_is_not_asked_so_the_answer_arrives_readable_and_metered():
    """An OpenAI-compatible upstream that compresses its answer when the request accepts it (aiohttp's client
    accepts gzip unless told otherwise): the gateway relays the bytes as they come, and passes on no
    Content-Encoding, so it must ask for them uncompressed; then the client reads JSON and the tokens are counted.
    Wrong version (the bug this found): no Accept-Encoding sent, so the client got deflate bytes it could not read,
    labelled JSON, and the request was metered as 0 tokens."""
    asked: list[str | None] = []

    async def answer(request):
        asked.append(request.headers.get("Accept-Encoding"))
        response = web.json_response({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 6},
                                      "pad": "x" * 2000})
        response.enable_compression()  # as the request allows: nothing, when it accepts only identity
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    server = TestServer(app)
    await server.start_server()
    state = FixedState(str(server.make_url("")).rstrip("/"))
    try:
        async with opened(state) as (client, made):
            got = await client.post("/v1/chat/completions", json={"model": "m"}, headers={"Authorization": f"Bearer {KEY}"})
            assert got.status == 200 and (await got.json())["usage"] == {"prompt_tokens": 5, "completion_tokens": 6}
            await made._flush()
    finally:
        await server.close()
    assert asked == ["identity"]
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in state.usage] == [(5, 6)]


async def test_the_upstream_session_never_cuts_a_long_answer_and_gives_up_connecting_after_10_s(gateway):
    """A stream may last as long as llama-server generates: the gateway's session to the upstreams has no total
    timeout (aiohttp's default, 5 minutes, would cut a long generation), and gives up connecting after 10 s.
    Wrong versions: a total timeout; another connect timeout, or none."""
    _, made, _ = gateway
    assert (made.session.timeout.total, made.session.timeout.sock_connect) == (None, 10)


async def test_head_is_not_taken_for_get_on_the_gateways_own_routes(gateway):
    """/health, /metrics and /v1/models answer GET only: HEAD is 405 like any other method (aiohttp would add HEAD to
    each GET route unless told not to). Wrong version: HEAD allowed on one of them."""
    client, _, _ = gateway
    for path in ("/health", "/metrics", "/v1/models"):
        answer = await client.head(path, headers={"Authorization": f"Bearer {KEY}"})
        assert answer.status == 405, path


async def test_accounting_reaches_the_service_each_flush_s_without_anyone_asking(upstream):
    """Nobody calls _flush here: the gateway's own loop sends the records once a second (FLUSH_S).
    Wrong versions: the loop never runs, or dies at its first sleep."""
    server, _, _ = upstream
    state = FixedState(str(server.make_url("")).rstrip("/"))
    async with opened(state) as (client, _):
        answer = await client.post("/v1/chat/completions", json={"model": "m"}, headers={"Authorization": f"Bearer {KEY}"})
        assert answer.status == 200
        for _ in range(200):  # bounded: 10 s, ten rounds
            if state.usage:
                break
            await asyncio.sleep(0.05)
        assert [(r["model"], r["status"]) for r in state.usage] == [("m", 200)]



async def test_a_key_scoped_to_other_models_is_refused_403_for_this_one_and_it_goes_nowhere(gateway, upstream):
    """Wrong version: the model not passed to the key's check (a scoped key reaches every model)."""
    client, made, state = gateway
    _, seen, _ = upstream
    state.state["keys"].append({**state.state["keys"][0], "id": 2, "hash": key_hash("bk-scoped"), "models": ["n"],
                                "fingerprint": "fp2"})
    made.router.update(state.state)
    answer = await client.post("/v1/chat/completions", json={"model": "m"}, headers={"Authorization": "Bearer bk-scoped"})
    assert answer.status == 403 and (await answer.json())["error"]["message"] == "key fp2 may use n, not m"
    assert seen == []


async def test_an_unexpected_failure_is_answered_500_and_accounted_500(gateway, monkeypatch):
    """A failure the relay does not expect (here the routing raises once): aiohttp answers 500, and the record says
    500 too. Wrong version: the record's status made up (501)."""
    client, made, state = gateway
    real = made.router.admit
    calls = []

    async def admit(model, key):
        calls.append(model)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return await real(model, key)

    monkeypatch.setattr(made.router, "admit", admit)
    answer = await client.post("/v1/chat/completions", json={"model": "m"}, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status == 500
    await made._flush()
    assert [r["status"] for r in state.usage] == [500]


async def test_a_client_that_leaves_while_its_request_waits_for_a_slot_is_accounted_499(upstream):
    """One slot, held by a stream; a second request waits for it, and its client leaves: 499, nothing sent upstream
    for it. Wrong versions: the leaving read as done (a missing meter's state asked: 500)."""
    server, seen, release = upstream
    state = FixedState(str(server.make_url("")).rstrip("/"), parallel=1)
    async with opened(state) as (client, made):
        first = await client.post("/v1/chat/completions", json={"model": "m", "stream": True},
                                  headers={"Authorization": f"Bearer {KEY}"})
        await first.content.readline()  # in progress: the slot is taken
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json={"model": "m"},
                                                  headers={"Authorization": f"Bearer {KEY}"}))
        while not made.router.waiting():
            await asyncio.sleep(0.01)
        waiting.cancel()
        for _ in range(200):  # bounded: 10 s
            if made.pending or state.usage:
                break
            await asyncio.sleep(0.05)
        release.set()
        await first.read()
        await made._flush()
    assert [r["status"] for r in state.usage][:1] == [499] and len(seen) == 1

"""The gateway's door (issue 31, sections 3 and 4), in process but over real TCP as `board gateway` listens
(app.gateway.server.open_site): requests go out on raw sockets, byte for byte as written (no client normalises a
path here), to a gateway in front of an upstream that records every request it gets.

- Only the route table reaches the upstream, by the route's own path: every traversal spelling is 404 in OpenAI's
  shape and the upstream sees nothing.
- Every route but /health and /metrics is keyed, a route added later too.
- A body whose Content-Encoding lies is 400.
- The connection limits: a head that never ends and an idle keep-alive are cut, a body that stalls is 408, the
  caps per address and in all close the oldest idle connection first, and refuse (503) only when every one is busy.
- A streamed line with no end is cut with an error in OpenAI's shape.
The flood under a real open-file limit is tests/integration/test_gateway_flood.py.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from dataclasses import replace

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from app.config import Config, GatewaySettings
from app.gateway.server import LINE_LIMIT, RELAYED, Gateway, open_site
from tests.unit.test_gateway_relay import KEY, FixedState

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


class Upstream:
    """llama-server's stand-in: records every request (method, raw path); /v1/chat/completions answers, held
    while `hold` is clear; /v1/completions streams one line that never ends."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.streamed = 0

    async def any(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.raw_path))
        await request.read()
        if request.path == "/v1/completions":
            return await self.endless(request)
        await self.hold.wait()
        return web.json_response({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    async def endless(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"text":"')
        piece = b"x" * 65536
        try:
            for _ in range(32 * LINE_LIMIT // len(piece)):  # bounded: 32 times the limit, never a newline
                await response.write(piece)
                self.streamed += len(piece)
        except ConnectionError:
            pass
        return response


@pytest.fixture
async def upstream():
    fake = Upstream()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.any)
    server = TestServer(app)
    await server.start_server()
    fake.url = str(server.make_url("")).rstrip("/")
    yield fake
    fake.hold.set()
    await server.close()


async def start_gateway(upstream: Upstream, **settings):
    made = Gateway(Config(gateway=GatewaySettings(**settings)), FixedState(upstream.url, parallel=64))
    app_before = made.app

    def app_with_extra():  # a route added after the door was written: keyed like the others
        app = app_before()
        async def extra(request):
            return web.json_response({"extra": True})

        app.router.add_get("/v1/extra", extra)
        return app

    made.app = app_with_extra
    runner, site = await open_site(made, "127.0.0.1:0")
    while not made.router.known:
        await asyncio.sleep(0.01)
    return made, runner, site.port


@pytest.fixture
async def gateway(upstream):
    made, runner, port = await start_gateway(upstream)
    yield made, port
    await runner.cleanup()


async def raw(port: int, head: bytes, body: bytes = b"", source: str = "127.0.0.1") -> tuple[int, bytes]:
    """Send exactly these bytes (Connection: close) and read the whole answer: (status, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(head + body)
    answer = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def request(method: str, path: str, body: bytes = BODY, key: str | None = KEY, extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"{method} {path} HTTP/1.1\r\nHost: gw\r\n{auth}Content-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


TRAVERSALS = [
    ("GET", "/v1/../slots"), ("GET", "/v1/../props"), ("POST", "/v1/../slots/0?action=erase"),
    ("GET", "/v1/%2e%2e/props"), ("GET", "/v1/%2E%2E/slots"), ("GET", "/v1/..%2fprops"), ("GET", "/v1/..%2Fslots"),
    ("GET", "/v1/./../props"), ("GET", "/v1//../../slots"), ("POST", "/v1/chat/completions/../../slots/0?action=erase"),
    ("POST", "/v1/chat/completions/%2e%2e/%2e%2e/slots/0?action=erase"), ("POST", "/v1/./chat/completions"),
    ("POST", "//v1/chat/completions"), ("POST", "/v1/%63hat/completions"), ("POST", "/v1/chat/completions/"),
    ("POST", "/v1/chat%2fcompletions"), ("GET", "/slots"), ("GET", "/props"), ("POST", "/slots/0?action=erase"),
    ("POST", "/v1/chat/completions/control"), ("GET", "/v1/stream"), ("POST", "/v1/streams/lookup"),
    ("GET", "/v1/health"), ("POST", "/completion"), ("POST", "/tokenize"), ("GET", "/v1/models/../../props"),
]


class TestOnlyTheRouteTable:
    @pytest.mark.parametrize(("method", "path"), TRAVERSALS)
    async def test_a_path_off_the_table_or_not_normal_is_404_and_reaches_nothing(self, gateway, upstream, method,
                                                                                  path):
        _, port = gateway
        status, body = await raw(port, request(method, path))
        assert status == 404, body
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "code"} and error["code"] == "not_found"
        assert upstream.seen == []

    async def test_each_relayed_route_reaches_the_upstream_by_its_own_path_without_the_query(self, gateway, upstream):
        _, port = gateway
        for path in RELAYED:
            if path == "/v1/completions":
                continue  # the endless stream's route (TestEndlessLine)
            status, body = await raw(port, request("POST", path + "?x=/../../slots"))
            assert status == 200, (path, body)
        assert upstream.seen == [("POST", path) for path in RELAYED if path != "/v1/completions"]

    async def test_the_wrong_method_on_a_route_is_405_and_reaches_nothing(self, gateway, upstream):
        _, port = gateway
        status, body = await raw(port, request("GET", "/v1/chat/completions", b""))
        assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed"
        assert upstream.seen == []

    @pytest.mark.parametrize("path", ["/v1/chat%2fcompletions", "/v1/%63hat/completions", "/v1/./chat/completions",
                                      "/v1/models/../chat/completions", "//v1/chat/completions"])
    async def test_the_wrong_method_on_a_path_that_is_not_normal_is_404_not_405(self, gateway, upstream, path):
        """A spelling of a route that is not its own is no route, whatever the method: 405 would tell a prober which
        spelling reaches which route (and the Allow list).
        Wrong versions: 405 whenever aiohttp's decoded path matched a route; the raw path not compared."""
        _, port = gateway
        status, body = await raw(port, request("GET", path, b""))
        assert status == 404 and json.loads(body)["error"]["code"] == "not_found", path
        assert upstream.seen == []


class TestKeyedByDefault:
    async def test_every_route_but_health_and_metrics_asks_for_a_key_one_added_later_too(self, gateway, upstream):
        made, port = gateway
        routes = {(r.method, r.resource.canonical) for r in made.app().router.routes()}
        routes.add(("GET", "/v1/extra"))
        assert ("POST", "/v1/chat/completions") in routes and ("GET", "/v1/models") in routes
        for method, path in sorted(routes):
            status, body = await raw(port, request(method, path, key=None))
            if path in ("/health", "/metrics"):
                assert status == 200, path
            else:
                assert status == 401 and (method == "HEAD" or json.loads(body)["error"]["code"] == "invalid_api_key")
            status, _ = await raw(port, request(method, path, key="bk-not-a-key"))
            assert status == (200 if path in ("/health", "/metrics") else 401), path
        assert upstream.seen == []
        status, body = await raw(port, request("GET", "/v1/extra"))  # the key opens it
        assert status == 200 and json.loads(body) == {"extra": True}


class TestBody:
    async def test_a_body_whose_content_encoding_lies_is_400(self, gateway, upstream):
        _, port = gateway
        status, body = await raw(port, request("POST", "/v1/chat/completions", BODY, extra="Content-Encoding: gzip\r\n"))
        assert status == 400 and json.loads(body)["error"]["code"] == "invalid_body"
        assert upstream.seen == []
        status, body = await raw(port, request("POST", "/v1/chat/completions", gzip.compress(BODY),
                                               extra="Content-Encoding: gzip\r\n"))
        assert status == 200 and upstream.seen == [("POST", "/v1/chat/completions")]


async def held_at_the_upstream(upstream, port: int, *sources: str) -> list:
    """A request from each local address in `sources`, held by the upstream: returns once every one has reached it,
    with their connections' (reader, writer)."""
    upstream.hold.clear()
    opened = [await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)) for source in sources]
    for _, writer in opened:
        writer.write(request("POST", "/v1/chat/completions"))
    while len(upstream.seen) < len(opened):
        await asyncio.sleep(0.01)
    return opened


async def closed(reader: asyncio.StreamReader) -> bytes:
    """What the gateway sent before it closed the connection (bounded: a gateway that never closes fails)."""
    return await asyncio.wait_for(reader.read(), 30)


class TestSlowAndIdle:
    async def test_a_head_that_never_ends_is_cut_and_a_whole_one_is_answered(self, upstream):
        made, runner, port = await start_gateway(upstream, head_timeout_s=0.3)
        try:
            silent = await asyncio.open_connection("127.0.0.1", port)
            partial = await asyncio.open_connection("127.0.0.1", port)
            partial[1].write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")
            assert await closed(silent[0]) == b"" and await closed(partial[0]) == b""
            assert made.connections.cut == 2
            status, _ = await raw(port, request("POST", "/v1/chat/completions"))  # a whole head in time: answered
            assert status == 200
        finally:
            await runner.cleanup()

    async def test_an_idle_keep_alive_is_closed_after_idle_timeout_and_not_by_the_head_clock(self, upstream):
        made, runner, port = await start_gateway(upstream, idle_timeout_s=0.3, head_timeout_s=30)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request("POST", "/v1/chat/completions").replace(b"Connection: close", b"Connection: keep-alive"))
            answer = await closed(reader)  # answered, then closed for idling
            assert answer.startswith(b"HTTP/1.1 200") and made.connections.cut == 1
        finally:
            await runner.cleanup()

    async def test_an_idle_keep_alive_is_cut_by_the_gateways_own_clock_before_aiohttps_backstop(self, upstream):
        """aiohttp's own keep-alive clock is set to 2 * idle_timeout_s + 1, a backstop well after the gateway's, which
        counts the cut: with idle_timeout_s 3 the gateway's clock (3 s) is the one that closes an idle connection.
        Wrong version: a backstop that runs first for a longer idle_timeout_s (2 / 3 + 1 s: closed uncounted)."""
        made, runner, port = await start_gateway(upstream, idle_timeout_s=3, head_timeout_s=30)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(keep_alive(request("POST", "/v1/chat/completions")))
            answer = await closed(reader)
            assert answer.startswith(b"HTTP/1.1 200") and made.connections.cut == 1
        finally:
            await runner.cleanup()

    async def test_a_keyed_body_that_stalls_is_408_and_closed(self, upstream):
        made, runner, port = await start_gateway(upstream, body_timeout_s=0.3)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request("POST", "/v1/chat/completions", BODY)[:-len(BODY) + 1])  # one byte of the body
            answer = await closed(reader)
            assert b" 408 " in answer.split(b"\r\n")[0]
            assert json.loads(answer.partition(b"\r\n\r\n")[2]) == {"error": {
                "message": "the request's body did not arrive within 0.3 s ([gateway] body_timeout_s)",
                "type": "invalid_request_error", "code": "request_timeout"}}
            assert upstream.seen == []
        finally:
            await runner.cleanup()


class TestCaps:
    async def test_a_newcomer_over_the_address_cap_closes_that_addresss_oldest_idle_connection(self, upstream):
        """127.0.0.3's idle connection is the oldest of all; 127.0.0.2, at its cap, opens one more: its own oldest
        goes, not 127.0.0.3's.
        Wrong versions: the oldest idle connection of any address closed; the newest of the address; the cap
        reached one connection late."""
        made, runner, port = await start_gateway(upstream, max_connections_per_address=3)
        try:
            other = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.3", 0))
            while not made.connections.by_address:  # counted in: the oldest idle connection of all
                await asyncio.sleep(0.01)
            idle = [await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0)) for _ in range(3)]
            newcomer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            while not made.connections.cut:
                await asyncio.sleep(0.01)
            assert made.connections.by_address == {"127.0.0.2": 3, "127.0.0.3": 1}
            assert await closed(idle[0][0]) == b""  # the oldest of 127.0.0.2's, not 127.0.0.3's, not the newest
            for reader, writer in (newcomer, other):
                writer.write(request("POST", "/v1/chat/completions"))
                assert (await closed(reader)).startswith(b"HTTP/1.1 200")
        finally:
            await runner.cleanup()

    async def test_busy_connections_are_never_closed_for_a_newcomer_who_gets_503(self, upstream):
        made, runner, port = await start_gateway(upstream, max_connections=2)
        try:
            busy = await held_at_the_upstream(upstream, port, "127.0.0.2", "127.0.0.3")  # both requests in progress
            status, body = await raw(port, request("POST", "/v1/chat/completions"), source="127.0.0.4")
            assert status == 503 and json.loads(body)["error"]["code"] == "too_many_connections"
            upstream.hold.set()
            for reader, _ in busy:
                assert (await closed(reader)).startswith(b"HTTP/1.1 200")
            assert made.connections.refused == 1 and made.connections.cut == 0
        finally:
            await runner.cleanup()

    async def test_an_address_whose_connections_are_all_busy_gets_503_and_another_address_is_served(self, upstream,
                                                                                                   caplog):
        """max_connections_per_address 2, both of 127.0.0.2's busy: its third gets 503 (with Retry-After, in
        OpenAI's shape) and is closed, leaving no error in the log; 127.0.0.3 is let in. Wrong versions: the
        newcomer let in (uncounted) when its address has no idle connection to close; the refusals' count set, not
        added to; the refused connection's loss
        passed to a protocol it never had (an error logged by asyncio)."""
        made, runner, port = await start_gateway(upstream, max_connections_per_address=2)
        try:
            busy = await held_at_the_upstream(upstream, port, "127.0.0.2", "127.0.0.2")
            for _ in range(2):  # each newcomer refused alike, each counted
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
                writer.write(request("POST", "/v1/chat/completions"))
                answer = await closed(reader)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b"\r\n")[0] == b"HTTP/1.1 503 Service Unavailable" and b"\r\nRetry-After: 1" in head
            assert json.loads(body) == {"error": {"message": "the gateway has too many connections; try again shortly",
                                                  "type": "server_error", "code": "too_many_connections"}}
            other = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.3", 0))
            other[1].write(request("POST", "/v1/chat/completions"))
            while len(upstream.seen) < 3:
                await asyncio.sleep(0.01)
            upstream.hold.set()
            for reader, _ in (*busy, other):
                assert (await closed(reader)).startswith(b"HTTP/1.1 200")
            assert made.connections.refused == 2 and made.connections.cut == 0
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        finally:
            await runner.cleanup()

    async def test_the_cap_is_lowered_to_what_the_open_file_limit_holds(self):
        from app.gateway.connections import BACKLOG, FD_RESERVE, connection_cap

        assert connection_cap(4096, 1024) == (1024 - FD_RESERVE - 2 * BACKLOG) // 2 == 352
        assert connection_cap(4096, 1025) == 352 and isinstance(connection_cap(4096, 1025), int)  # whole connections
        assert connection_cap(100, 65536) == 100
        assert connection_cap(4096, 10) == 1


class TestEndlessLine:
    async def test_a_streamed_line_with_no_end_is_cut_with_an_error_in_openais_shape(self, gateway, upstream, capsys):
        """Wrong versions: the error's message, type or code changed; not an event of its own; not logged."""
        made, port = gateway
        body = json.dumps({"model": "m", "prompt": "hi", "stream": True}).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("POST", "/v1/completions", body))
        answer = await closed(reader)
        events = [line for line in answer.split(b"\n") if line.startswith(b"data: {\"error\"")]
        [event] = events
        assert json.loads(event[6:]) == {"error": {
            "message": "server 7 (m) sent a line over 1 MB; the gateway cut the stream", "type": "server_error",
            "code": "upstream_line_too_long"}}
        assert answer.count(b"\n\ndata: {\"error\"") == 1  # after a blank line: an event of its own
        assert len(answer) < LINE_LIMIT + 4096  # relayed up to the limit, then cut
        assert upstream.streamed < 32 * LINE_LIMIT  # the upstream was stopped, not read to its end
        logged = capsys.readouterr().err
        assert "board gateway: server 7 (m) streamed a line over 1 MB: cut\n" in logged
        assert "board gateway: POST /v1/completions 502 model=m " in logged  # accounted as the upstream's failure


def dead_port() -> int:
    """A loopback port nothing listens on now: connections to it are refused."""
    import socket

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


class TestDeadUpstream:
    async def test_a_server_that_refuses_a_request_leaves_the_routing_at_once(self, upstream, monkeypatch):
        """Two servers for `m`; server 7's llama-server is gone (nothing listens on its port), and the gateway's own
        /health round has not come yet (held off here). The first request that meets it gets 502 and takes it out
        of the routing: the next ones go to server 8, not to 7 again (the nearest wrong version: 7 kept, and every
        request sent to it first, as ties go to the lowest id)."""
        import app.gateway.server

        monkeypatch.setattr(app.gateway.server, "RECHECK_S", 3600)
        made = Gateway(Config(gateway=GatewaySettings()), FixedState(f"http://127.0.0.1:{dead_port()}", parallel=4))
        made.client.state["servers"].append(dict(made.client.state["servers"][0], id=8, url=upstream.url))
        runner, site = await open_site(made, "127.0.0.1:0")
        try:
            while not made.router.known:
                await asyncio.sleep(0.01)
            statuses = [(await raw(site.port, request("POST", "/v1/chat/completions")))[0] for _ in range(4)]
            assert statuses == [502, 200, 200, 200] and made.router.down == {7}
        finally:
            await runner.cleanup()

    async def test_a_server_that_stopped_listening_leaves_the_routing_before_a_request_meets_it_and_comes_back(
            self, upstream, capsys):
        """Server 7's llama-server is gone while nobody asks for the model: the gateway's own /health round (each
        RECHECK_S) takes it out (the nearest wrong version: only a request that meets it does, and that request gets
        502), so the first request afterwards goes to server 8, which answers and stays routed. Once 7's port
        answers /health again, the round routes to it again. Each change is a line of the log; a server the service
        no longer lists is forgotten (the wrong versions: a line changed or left out; one not listed kept down)."""
        port = dead_port()
        made = Gateway(Config(gateway=GatewaySettings()), FixedState(f"http://127.0.0.1:{port}", parallel=4))
        made.client.state["servers"].append(dict(made.client.state["servers"][0], id=8, url=upstream.url))
        runner, site = await open_site(made, "127.0.0.1:0")
        try:
            for _ in range(200):  # bounded: the round runs each second
                if made.router.down:
                    break
                await asyncio.sleep(0.05)
            assert made.router.down == {7}
            assert (await raw(site.port, request("POST", "/v1/chat/completions")))[0] == 200
            assert made.router.down == {7} and 8 in made.router.servers
            revived = web.Application()

            async def ok(request):
                return web.json_response({"status": "ok"})

            revived.router.add_get("/health", ok)
            back = web.AppRunner(revived)
            await back.setup()
            await web.TCPSite(back, "127.0.0.1", port).start()
            try:
                for _ in range(200):
                    if not made.router.down:
                        break
                    await asyncio.sleep(0.05)
                assert made.router.down == set()
                made.router.down.add(99)  # a server the service no longer lists
                for _ in range(200):
                    if not made.router.down:
                        break
                    await asyncio.sleep(0.05)
                assert made.router.down == set()
            finally:
                await back.cleanup()
            logged = capsys.readouterr().err
            assert ("board gateway: server 7 (m) refuses connections: out of the routing until it answers\n"
                    "board gateway: POST /v1/chat/completions 200 ") in logged
            assert "\nboard gateway: server 7 (m) answers again\n" in logged
            assert "server 8 " not in logged
        finally:
            await runner.cleanup()

    async def test_a_model_whose_every_server_is_down_is_503_unavailable_not_draining(self, upstream):
        made = Gateway(Config(gateway=GatewaySettings()), FixedState(upstream.url))
        made.router.update(made.client.state)
        made.router.down.add(7)
        refusal = made.router._unserved("m")
        assert (refusal.status, refusal.code) == (503, "model_unavailable")


class TestSettings:
    def test_the_doors_limits_are_read_from_gateway_and_a_bad_one_is_refused_naming_it(self, tmp_path):
        from app.config import ConfigError, load_config

        path = tmp_path / "board.toml"
        path.write_text("[gateway]\nhead_timeout_s = 5\nbody_timeout_s = 20.5\nidle_timeout_s = 15\n"
                        "max_connections = 1000\nmax_connections_per_address = 50\n")
        settings = load_config(environ={"BOARD_CONFIG": str(path)}).gateway
        assert (settings.head_timeout_s, settings.body_timeout_s, settings.idle_timeout_s, settings.max_connections,
                settings.max_connections_per_address) == (5, 20.5, 15, 1000, 50)
        defaults = GatewaySettings()
        assert (defaults.head_timeout_s, defaults.body_timeout_s, defaults.idle_timeout_s, defaults.max_connections,
                defaults.max_connections_per_address) == (10, 60, 30, 4096, 256)
        for name, value in (("head_timeout_s", "0"), ("max_connections", "-1"), ("max_connections_per_address", "0")):
            path.write_text(f"[gateway]\n{name} = {value}\n")
            with pytest.raises(ConfigError, match=f"\\[gateway\\] {name} must be a number more than 0"):
                load_config(environ={"BOARD_CONFIG": str(path)})
        for name, value in (("idle_timeout_s", '"30"'), ("body_timeout_s", "true")):
            path.write_text(f"[gateway]\n{name} = {value}\n")
            with pytest.raises(ConfigError, match=f"\\[gateway\\] {name}: expected a number, got {value}$"):
                load_config(environ={"BOARD_CONFIG": str(path)})


async def test_a_server_back_from_down_takes_a_waiting_request_at_once(upstream):
    """Server 7 down, server 8's one slot taken: the next request waits; 7 answering again hands it 7 (not after
    some other request ends, nor at the queue's timeout)."""
    made = Gateway(Config(gateway=GatewaySettings()), FixedState(upstream.url, parallel=1))
    made.client.state["servers"].append(dict(made.client.state["servers"][0], id=8))
    made.router.update(made.client.state)
    key = made.router.keys[next(iter(made.router.keys))]
    made.router.down.add(7)
    held = await made.router.admit("m", key)
    assert held.id == 8
    waiting = asyncio.create_task(made.router.admit("m", key))
    await asyncio.sleep(0)
    assert not waiting.done()
    made.router.up(7)
    assert (await asyncio.wait_for(waiting, 5)).id == 7


async def answered(reader: asyncio.StreamReader) -> bytes:
    """One whole answer off a keep-alive connection (its head, then Content-Length bytes), the connection left open."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:"))
    return head + await asyncio.wait_for(reader.readexactly(length), 30)


def keep_alive(head: bytes) -> bytes:
    return head.replace(b"Connection: close", b"Connection: keep-alive")


class TestKeepAliveClocksAndCaps:
    async def test_the_next_requests_head_on_a_keep_alive_has_the_head_clock_not_what_is_left_of_the_idle_one(
            self, upstream):
        """A member's keep-alive answered, then half a head of the next request and nothing more: cut by
        head_timeout_s, though idle_timeout_s is long.
        Wrong versions: the head clock not restarted at the next request's first byte (the idle clock runs on);
        the next request's bytes never leave the idle set (no clock at all)."""
        made, runner, port = await start_gateway(upstream, head_timeout_s=0.3, idle_timeout_s=120)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(keep_alive(request("POST", "/v1/chat/completions")))
            assert (await answered(reader)).startswith(b"HTTP/1.1 200")
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n")  # and no more
            assert await closed(reader) == b""
            assert made.connections.cut == 1 and made.connections.open == set()
        finally:
            await runner.cleanup()

    async def test_the_next_requests_head_trickled_on_a_keep_alive_is_cut_by_the_head_clock_of_its_first_byte(
            self, upstream):
        """The next request's head sent a byte every 0.1 s: the head clock (0.5 s) started at its first byte is not
        restarted by the later ones, so the connection is cut before the head is whole (the gateway's clock and the
        test's sleeps are timers of one loop). Wrong version: the connection left marked as between requests once
        its next head began (every byte restarts the head clock: a slowloris on a keep-alive is never cut)."""
        made, runner, port = await start_gateway(upstream, head_timeout_s=0.5, idle_timeout_s=120)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(keep_alive(request("POST", "/v1/chat/completions")))
            assert (await answered(reader)).startswith(b"HTTP/1.1 200")
            head = request("POST", "/v1/chat/completions")
            for byte in head[:30]:  # 3 s at this pace: six head clocks
                if writer.is_closing() or reader.at_eof():
                    break
                writer.write(bytes([byte]))
                await asyncio.sleep(0.1)
            else:
                writer.write(head[30:])  # still open: the head made whole
            try:
                sent = await closed(reader)
            except ConnectionResetError:
                sent = b""
            assert sent == b"" and made.connections.cut == 1
        finally:
            await runner.cleanup()

    async def test_an_answered_keep_alive_is_idle_again_and_gives_way_to_a_newcomer_over_the_cap(self, upstream):
        """max_connections 1: a member's keep-alive, answered and now idle, is closed for a newcomer from another
        address, who is answered (not 503).
        Wrong versions: an answered connection not put back among the idle ones (it stays busy: the newcomer gets
        503); the newcomer refused while an idle one could go."""
        made, runner, port = await start_gateway(upstream, max_connections=1)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            writer.write(keep_alive(request("POST", "/v1/chat/completions")))
            assert (await answered(reader)).startswith(b"HTTP/1.1 200")
            status, _ = await raw(port, request("POST", "/v1/chat/completions"), source="127.0.0.3")
            assert status == 200
            assert await closed(reader) == b""
            assert made.connections.cut == 1 and made.connections.refused == 0
        finally:
            await runner.cleanup()


class TestTheKeyHeader:
    @pytest.mark.parametrize("header", ["Basic " + KEY, "Token " + KEY, KEY, "Bearer", "Bearer ", "Bearer" + KEY,
                                        "Bearer\t" + KEY])
    async def test_only_a_bearer_scheme_carries_the_key(self, gateway, upstream, header):
        """The member's own key under another scheme, or no token at all, is 401 and reaches nothing.
        Wrong versions: any scheme's token taken as the key; the scheme's case compared (refuses `bearer`)."""
        _, port = gateway
        head = request("POST", "/v1/chat/completions", key=None, extra=f"Authorization: {header}\r\n")
        status, body = await raw(port, head)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", header
        assert upstream.seen == []

    @pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
    async def test_the_bearer_scheme_in_any_case_with_the_key_is_answered(self, gateway, upstream, scheme):
        """RFC 9110: the scheme is case-insensitive; spaces around the token are not part of it.
        Wrong versions: `Bearer` compared as written; the token taken unstripped."""
        _, port = gateway
        head = request("POST", "/v1/chat/completions", key=None, extra=f"Authorization: {scheme}  {KEY} \r\n")
        status, body = await raw(port, head)
        assert status == 200, body


class TestMetricsOnLoopbackOnly:
    async def test_metrics_go_by_the_peers_address_not_the_host_header(self, gateway, upstream):
        """From 127.0.0.2 (not the address the gateway's host scrapes from) /metrics is 403 whatever the Host header
        says; from 127.0.0.1 it is 200 whatever the Host header says.
        Wrong versions: the Host header (or X-Forwarded-For) read for where the request came from; any 127.x peer."""
        _, port = gateway
        for host in ("127.0.0.1", f"127.0.0.1:{port}", "[::1]", "localhost"):
            head = (f"GET /metrics HTTP/1.1\r\nHost: {host}\r\nX-Forwarded-For: 127.0.0.1\r\nX-Real-IP: 127.0.0.1\r\n"
                    "Connection: close\r\n\r\n").encode()
            status, body = await raw(port, head, source="127.0.0.2")
            assert status == 403 and json.loads(body)["error"]["code"] == "forbidden", host
            status, body = await raw(port, head.replace(host.encode(), b"gw.example", 1), source="127.0.0.1")
            assert status == 200 and b"# TYPE" in body


    async def test_metrics_is_prometheus_text_from_ipv6_loopback_too_and_403_in_openais_shape_elsewhere(self, upstream):
        """Prometheus reads the exposition as text/plain; charset=utf-8. A gateway listening on [::1] is scraped
        from ::1, which is this host as much as 127.0.0.1 is; from elsewhere the member reads why, in OpenAI's shape.
        Wrong versions: ::1 refused; the content type or charset dropped or changed; the refusal's message or
        type left out or changed."""
        made = Gateway(Config(gateway=GatewaySettings()), FixedState(upstream.url))
        runner, site = await open_site(made, "[::1]:0")
        try:
            reader, writer = await asyncio.open_connection("::1", site.port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            answer = await closed(reader)
            writer.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ") and b"\r\nContent-Type: text/plain; charset=utf-8\r\n" in head
            assert b"# TYPE board_gateway_requests_total counter" in body
        finally:
            await runner.cleanup()
        made, runner, port = await start_gateway(upstream)
        try:
            status, body = await raw(port, b"GET /metrics HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
                                     source="127.0.0.2")
            assert status == 403 and json.loads(body) == {"error": {
                "message": "/metrics answers only on this host (scrape it through 127.0.0.1)",
                "type": "invalid_request_error", "code": "forbidden"}}
        finally:
            await runner.cleanup()

class TestTheHeadClock:
    async def test_a_head_trickled_a_byte_at_a_time_is_cut_by_the_head_clock_of_its_start(self, upstream):
        """A stranger sends a head one byte at a time, each well inside head_timeout_s: the clock runs from the
        connection's start, so it is cut long before the head is whole, and never answered.
        Wrong versions: the head clock restarted at every byte (a slowloris holds the connection for ever); at
        every byte of a connection still in the idle set."""
        made, runner, port = await start_gateway(upstream, head_timeout_s=0.5, idle_timeout_s=120)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = request("POST", "/v1/chat/completions", extra="X-Pad: " + "p" * 400 + "\r\n")

            async def trickle():
                for byte in head:  # 0.02 s a byte: the whole head would take 10 s, twenty head clocks
                    if writer.is_closing() or reader.at_eof():
                        return
                    writer.write(bytes([byte]))
                    await asyncio.sleep(0.02)

            sending = asyncio.create_task(trickle())
            try:
                try:
                    sent = await closed(reader)
                except ConnectionResetError:  # cut with the stranger's last bytes unread: the kernel resets, not ends
                    sent = b""
                assert sent == b""
            finally:
                sending.cancel()
            assert made.connections.cut == 1 and upstream.seen == []
        finally:
            await runner.cleanup()


    async def test_the_head_clock_runs_from_the_connections_start_not_from_its_first_byte(self, upstream):
        """head_timeout_s 1: a client that says nothing for 0.8 s, then sends its head's first byte and the rest at
        1.4 s is cut at 1 s, never answered (the gateway's clock and the test's sleeps are timers of one loop: their
        order is their deadlines'). Wrong version: a new connection not marked as sending its head (its first byte
        restarts the head clock, which would then run to 1.8 s)."""
        made, runner, port = await start_gateway(upstream, head_timeout_s=1, idle_timeout_s=120)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = request("POST", "/v1/chat/completions")
            await asyncio.sleep(0.8)
            writer.write(head[:1])
            await asyncio.sleep(0.6)
            if not writer.is_closing():
                writer.write(head[1:])
            try:
                sent = await closed(reader)
            except ConnectionResetError:
                sent = b""
            assert sent == b"" and made.connections.cut == 1
            assert [seen for seen in upstream.seen if seen != ("GET", "/health")] == []  # only the /health round's
        finally:
            await runner.cleanup()


async def a_newcomer_closes_the_members_idle_connection(made, port: int):
    """At a cap of 1 with nothing open: a member's idle connection takes the place, then a newcomer from another
    address closes it and is let in, the count staying at the cap. Returns the newcomer's (reader, writer)."""
    member = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.3", 0))
    while not made.connections.open:
        await asyncio.sleep(0.01)
    newcomer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.4", 0))
    while not made.connections.cut:
        await asyncio.sleep(0.01)
    assert made.connections.by_address == {"127.0.0.4": 1} and len(made.connections.open) == 1
    assert await closed(member[0]) == b""
    return newcomer


class TestAConnectionThatLeft:
    async def test_a_connection_its_client_closed_is_no_longer_one_a_newcomer_may_close(self, upstream):
        """max_connections 1: a stranger's connection opens and closes; a member's idle one takes the place; a
        newcomer then closes the member's (the only idle one left), and the count stays at the cap.
        Wrong versions: a connection that left kept among the idle ones (the newcomer "closes" it again and is let
        in beside the member's: over the cap)."""
        made, runner, port = await start_gateway(upstream, max_connections=1)
        try:
            _, gone = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            while not made.connections.open:
                await asyncio.sleep(0.01)
            gone.close()
            while made.connections.open:  # the gateway saw it go
                await asyncio.sleep(0.01)
            newcomer = await a_newcomer_closes_the_members_idle_connection(made, port)
            newcomer[1].write(request("POST", "/v1/chat/completions"))
            assert (await closed(newcomer[0])).startswith(b"HTTP/1.1 200")
        finally:
            await runner.cleanup()


class TestEvictionCountsOutAtOnce:
    async def test_a_newcomer_over_its_address_cap_closes_its_own_idle_one_and_not_another_for_the_total_cap(
            self, upstream):
        """max_connections 2, one per address: 127.0.0.3's idle connection is the oldest, 127.0.0.2's the newer.
        A newcomer from 127.0.0.2 closes 127.0.0.2's, which is counted out at once, so the total is under its cap
        and 127.0.0.3's stays; a second newcomer from 127.0.0.2 closes the first: two cut.
        Wrong versions: the closed one counted out only when its transport reports the loss (the newcomer also
        closes 127.0.0.3's for the total cap); the cut count set, not added to."""
        made, runner, port = await start_gateway(upstream, max_connections=2, max_connections_per_address=1)
        try:
            other = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.3", 0))
            while not made.connections.by_address:
                await asyncio.sleep(0.01)
            first = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            while len(made.connections.open) < 2:
                await asyncio.sleep(0.01)
            newcomer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            while not made.connections.cut:
                await asyncio.sleep(0.01)
            assert await closed(first[0]) == b""
            last = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            assert await closed(newcomer[0]) == b""
            assert made.connections.cut == 2 and made.connections.by_address == {"127.0.0.2": 1, "127.0.0.3": 1}
            for reader, writer in (last, other):
                writer.write(request("POST", "/v1/chat/completions"))
                assert (await closed(reader)).startswith(b"HTTP/1.1 200")
        finally:
            await runner.cleanup()


class BigStream:
    """An upstream that streams SIZE bytes of SSE lines, far more than the sockets between it and a client hold."""
    SIZE = 64 << 20

    def __init__(self) -> None:
        self.finished = False
        self.started = asyncio.Event()

    async def stream(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.started.set()
        line = b"data: " + b"x" * 65526 + b"\n\n"
        for _ in range(self.SIZE // len(line)):
            await response.write(line)
        await response.write(b"data: [DONE]\n\n")
        self.finished = True
        return response


class TestBackPressure:
    async def test_a_client_that_does_not_read_holds_the_upstream_back_and_gets_all_once_it_reads(self):
        """A member's client stops reading a long stream: the gateway stops writing to it (aiohttp is told its
        transport is full), so it stops reading the upstream, which waits (not finished); once the client reads, the
        gateway writes again and the whole stream arrives.
        Wrong versions: the transport's pause not passed on (the whole answer piled up in the gateway's memory, the
        upstream finished); its resume not passed on (the stream stalls for ever)."""
        big = BigStream()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", big.stream)
        server = TestServer(app)
        await server.start_server()
        big.url = str(server.make_url("")).rstrip("/")
        made, runner, port = await start_gateway(big)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(request("POST", "/v1/chat/completions"))
            await big.started.wait()
            [client] = made.connections.open
            while not client.inner.writing_paused and not big.finished:
                await asyncio.sleep(0.01)
            assert not big.finished
            received = 0
            async with asyncio.timeout(60):
                while chunk := await reader.read(1 << 20):
                    received += len(chunk)
            assert big.finished and received > big.SIZE
        finally:
            await runner.cleanup()
            await server.close()


async def test_a_server_that_accepts_and_never_answers_its_health_is_given_up_on_and_not_taken_out(upstream):
    """A llama-server busy past answering /health (it accepts, says nothing): the gateway's check gives up after its
    own timeout and reports 0 (not None: a busy server stays routed), so the round of checks goes on.
    Wrong versions: the check with no timeout of its own (the session has none in total: it waits for ever, and
    with it every later round)."""
    silent: list[asyncio.StreamWriter] = []

    async def accept(reader, writer):
        silent.append(writer)

    mute = await asyncio.start_server(accept, "127.0.0.1", 0)
    made, runner, _ = await start_gateway(upstream)
    try:
        server = replace(made.router.servers[7], url=f"http://127.0.0.1:{mute.sockets[0].getsockname()[1]}")
        assert await asyncio.wait_for(made._health(server), 30) == 0
        assert silent
    finally:
        await runner.cleanup()
        for writer in silent:
            writer.close()
        mute.close()


def refusal(message: str, code: str, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "code": code}}


LONG = "/v1/" + "x" * 120
NOT_A_ROUTE = ("{}: the gateway serves GET /v1/models and POST /v1/chat/completions, /v1/completions, /v1/embeddings"
               " and the rest of docs/gateway.md's list")


class TestWhatARefusalSays:
    """What the member reads: each refusal's message, type and code, in OpenAI's shape."""

    @pytest.mark.parametrize(("head", "status", "document"), [
        (request("GET", "/v1/chat/completions", b""), 405,
         refusal("/v1/chat/completions takes POST, not GET", "method_not_allowed")),
        (request("UNSUBSCRIBE", "/v1/models", b""), 405,
         refusal("/v1/models takes GET, not UNSUBSCRIB", "method_not_allowed")),
        (request("GET", "/v1/../slots?x=1", b""), 404, refusal(NOT_A_ROUTE.format("no route /v1/../slots"), "not_found")),
        (request("GET", LONG, b""), 404, refusal(NOT_A_ROUTE.format(f"no route {LONG[:79]}…"), "not_found")),
        (request("POST", "/v1/chat/completions", b'{"messages": []}'), 400,
         refusal("say which model: the request's \"model\" field (GET /v1/models lists them)", "model_required")),
        (request("POST", "/v1/chat/completions", b"{"), 400, refusal("the body is not JSON", "invalid_json")),
        (request("POST", "/v1/chat/completions", BODY, extra="Content-Encoding: gzip\r\n"), 400,
         refusal("the body could not be read as its Content-Encoding says (send it as it is, or compressed as the"
                 " header says)", "invalid_body")),
    ], ids=["405", "405-long-method", "404", "404-long-path", "no-model", "not-json", "bad-encoding"])
    async def test_each_refusal_says_what_and_why(self, gateway, upstream, head, status, document):
        """Wrong versions: a message, type or code changed or left out; the method or path not cut to its limit."""
        _, port = gateway
        assert await raw(port, head) == (status, json.dumps(document).encode())
        assert upstream.seen == []

    @pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
    async def test_a_body_over_max_body_mb_says_the_limit_whether_its_length_is_told_or_not(self, upstream, chunked):
        """Over [gateway] max_body_mb (0.5 MB here): 413, saying the limit and its setting, whether the client told
        the length (refused before reading) or sent it chunked (refused as aiohttp reads past it).
        Wrong versions: the message, type or code changed in either place."""
        made, runner, port = await start_gateway(upstream, max_body_mb=0.5)
        try:
            body = b'{"model": "m", "pad": "' + b"x" * (1 << 19) + b'"}'
            head = request("POST", "/v1/chat/completions", body)
            if chunked:
                head = head.split(b"Content-Length")[0] + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            else:
                head, body = head[:-len(body)], body
            status, answer = await raw(port, head, body)
            assert (status, json.loads(answer)) == (413, refusal(
                "the request is over 0.5 MB ([gateway] max_body_mb)", "request_too_large"))
            assert upstream.seen == []
        finally:
            await runner.cleanup()


async def test_a_gateway_restarted_at_once_listens_on_its_port_again(upstream):
    """`systemctl restart`: the gateway that stopped had just answered and closed connections (theirs wait in
    TIME_WAIT on its port); the next one binds the same port at once. Wrong version: the address not reusable (the
    restart fails with EADDRINUSE for a minute)."""
    made, runner, port = await start_gateway(upstream)
    try:
        status, _ = await raw(port, request("POST", "/v1/chat/completions"))  # Connection: close: the gateway closes
        assert status == 200
    finally:
        await runner.cleanup()
    again = Gateway(Config(gateway=GatewaySettings()), FixedState(upstream.url))
    runner, site = await open_site(again, f"127.0.0.1:{port}")
    try:
        assert site.port == port
        while not again.router.known:
            await asyncio.sleep(0.01)
        status, _ = await raw(port, request("GET", "/health", b"", key=None))
        assert status == 200
    finally:
        await runner.cleanup()


async def test_a_burst_of_connections_up_to_the_backlog_is_held_by_the_kernel_until_the_gateway_accepts_them(upstream):
    """The listener's backlog is BACKLOG (128): that many newcomers complete their handshake while the gateway is busy
    (its loop not accepting), none dropped. Wrong version: asyncio's default backlog (100): the 101st is dropped and
    its client waits a second for its retry."""
    import socket

    from app.gateway.connections import BACKLOG

    made, runner, port = await start_gateway(upstream)
    burst: list[socket.socket] = []
    try:
        for _ in range(BACKLOG - 8):  # the loop does not run meanwhile: nothing is accepted
            conn = socket.socket()
            conn.settimeout(0.5)
            conn.connect(("127.0.0.1", port))  # a SYN dropped for a full backlog is retried only after 1 s
            burst.append(conn)
    finally:
        for conn in burst:
            conn.close()
    try:
        assert len(burst) == BACKLOG - 8
    finally:
        await runner.cleanup()



class TestAClientThatLeaves:
    async def test_a_client_that_leaves_cancels_its_request_and_is_accounted_499(self, upstream, caplog):
        """The client closes its connection while the upstream still works on its answer: the handler is cancelled
        (so the upstream request is closed and llama-server frees the slot) and the request accounted as 499.
        Wrong version: handler_cancellation off (the handler waits for the whole answer nobody reads)."""
        made, runner, port = await start_gateway(upstream)
        try:
            [(reader, writer)] = await held_at_the_upstream(upstream, port, "127.0.0.1")
            writer.close()
            for _ in range(200):  # bounded: 10 s
                if made.pending or made.client.usage:
                    break
                await asyncio.sleep(0.05)
            assert [r["status"] for r in made.pending + made.client.usage] == [499]
            assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        finally:
            upstream.hold.set()
            await runner.cleanup()

    async def test_a_busy_connection_whose_client_left_is_not_one_a_newcomer_may_close(self, upstream):
        """max_connections 1: a member's request in progress, then the member leaves; the next member's idle
        connection takes the place, and a newcomer closes that one (the only idle one), staying at the cap.
        Wrong versions: the connection that left still counted, or idle again (the newcomer "closes" it and is let
        in beside the next member's: over the cap)."""
        made, runner, port = await start_gateway(upstream, max_connections=1)
        try:
            [(_, gone)] = await held_at_the_upstream(upstream, port, "127.0.0.2")
            gone.close()
            while made.connections.open or not (made.pending or made.client.usage):  # gone, and its request ended
                await asyncio.sleep(0.01)
            newcomer = await a_newcomer_closes_the_members_idle_connection(made, port)
            upstream.hold.set()
            newcomer[1].write(request("POST", "/v1/chat/completions"))
            assert (await closed(newcomer[0])).startswith(b"HTTP/1.1 200")
        finally:
            upstream.hold.set()
            await runner.cleanup()


class BrokenUpstream:
    """An upstream that promises 1,000 bytes, sends 10 and closes the connection."""

    async def answer(self, reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"choices\"")
        await writer.drain()
        writer.close()


async def test_an_upstream_that_breaks_off_its_answer_is_accounted_502_and_logged(capsys):
    """Wrong versions: another status accounted (503); the log line changed or left out."""
    broken = await asyncio.start_server(BrokenUpstream().answer, "127.0.0.1", 0)

    class Where:
        url = f"http://127.0.0.1:{broken.sockets[0].getsockname()[1]}"

    made, runner, port = await start_gateway(Where())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("POST", "/v1/chat/completions"))
        answer = await closed(reader)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'{"choices"')  # what came, then cut
        assert [r["status"] for r in made.pending + made.client.usage] == [502]
        assert "board gateway: server 7 (m) broke off its answer\n" in capsys.readouterr().err
    finally:
        await runner.cleanup()
        broken.close()



async def test_a_told_length_over_max_body_mb_is_refused_at_once_without_waiting_for_the_body(upstream):
    """Content-Length over the limit: 413 from the head alone, the body never awaited (a client told to wait for
    nothing). Wrong version: the length read only as the body arrives (the request waits for its body, then 408)."""
    made, runner, port = await start_gateway(upstream, max_body_mb=0.5, body_timeout_s=5)
    try:
        head = request("POST", "/v1/chat/completions", b"x" * ((1 << 19) + 1))[:-((1 << 19) + 1)]  # no body sent
        status, answer = await raw(port, head)
        assert (status, json.loads(answer)["error"]["code"]) == (413, "request_too_large")
    finally:
        await runner.cleanup()



class PeerTransport:
    """A transport whose peer's address asyncio could not give (None: the client reset it first) or is no (host,
    port) pair; it records what is written. Only to drive Watched.connection_made's odd cases."""

    def __init__(self, peer) -> None:
        self.peer, self.written, self.closed = peer, b"", False

    def get_extra_info(self, name, default=None):
        return self.peer if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


async def test_a_connection_whose_peer_is_not_a_host_port_pair_is_counted_under_what_asyncio_said():
    """Wrong versions: a peer that is not a pair indexed like one (the connection fails in connection_made); or
    counted under "None" whatever it was."""
    from app.gateway.connections import Connections, Watched

    made: list[asyncio.Protocol] = []

    def make() -> asyncio.Protocol:
        made.append(asyncio.Protocol())
        return made[-1]

    connections = Connections(cap=4, per_address=1, head_s=30, idle_s=30)
    first, second = Watched(connections, make), Watched(connections, make)
    first.connection_made(PeerTransport(None))
    second.connection_made(PeerTransport("/run/board/gateway.sock"))
    try:
        assert connections.by_address == {"None": 1, "/run/board/gateway.sock": 1} and len(made) == 2
    finally:
        first.close()
        second.close()


async def test_times_are_accounted_in_milliseconds_at_least_as_long_as_the_upstream_took(upstream, capsys):
    """The upstream holds its answer 0.3 s or more: the record's time to first byte and duration, and the log line's
    time, are at least 300 ms (a lower bound: no clock can make them shorter). Wrong versions: seconds divided
    instead of multiplied (0 ms)."""
    import re

    made, runner, port = await start_gateway(upstream)
    try:
        [(reader, writer)] = await held_at_the_upstream(upstream, port, "127.0.0.1")
        await asyncio.sleep(0.3)
        upstream.hold.set()
        assert (await closed(reader)).startswith(b"HTTP/1.1 200")
        [record] = made.pending + made.client.usage
        assert record["ttft_ms"] >= 300 and record["duration_ms"] >= record["ttft_ms"]
        [logged] = re.findall(r"POST /v1/chat/completions 200 .* (\d+)ms\n", capsys.readouterr().err)
        assert int(logged) >= 300
    finally:
        await runner.cleanup()


async def test_more_than_a_hundred_requests_in_flight_all_reach_the_upstream_at_once(upstream):
    """The upstream connections are bounded by max_connections (4096 by default), not by aiohttp's default pool of
    100: a 101st request in flight goes upstream at once. Wrong version: the pool's default limit (the 101st waits
    for one of the first hundred to end)."""
    made = Gateway(Config(gateway=GatewaySettings(max_concurrent_per_user=1000)),
                   FixedState(upstream.url, parallel=200))
    runner, site = await open_site(made, "127.0.0.1:0")
    conns = []
    try:
        while not made.router.known:
            await asyncio.sleep(0.01)
        upstream.hold.clear()
        for _ in range(101):
            reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
            writer.write(request("POST", "/v1/chat/completions"))
            conns.append((reader, writer))
        for _ in range(400):  # bounded: 20 s
            if len([s for s in upstream.seen if s[0] == "POST"]) == 101:
                break
            await asyncio.sleep(0.05)
        assert len([s for s in upstream.seen if s[0] == "POST"]) == 101
        upstream.hold.set()
        for reader, _ in conns:
            assert (await closed(reader)).startswith(b"HTTP/1.1 200")
    finally:
        upstream.hold.set()
        for _, writer in conns:
            writer.close()
        await runner.cleanup()

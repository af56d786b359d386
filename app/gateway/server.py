"""The gateway's HTTP side (aiohttp, both ways) and its link to the service.

One event loop serves every client; requests are relayed chunk by chunk (a stream is never buffered) and a client
that leaves cancels its handler (handler_cancellation), which closes the upstream connection, and llama-server
frees the slot. A thread follows the service over its socket: it reads gateway_state at start and on each
`gateway` event (keys, servers, bookings changed), so a revoked key stops at once. Accounting records go to the
service in batches (gateway_usage) once a second; the Prometheus counters are the gateway's own /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import resource
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from app.config import Config
from app.core.keys import key_hash
from app.core.text import inert
from app.errors import BadInput, BoardError
from app.gateway.connections import BACKLOG, Connections, connection_cap
from app.gateway.demand import Demand, quietly
from app.gateway.limits import Limits
from app.gateway.routing import Refused, Router, Upstream

FLUSH_S = 1.0
RECHECK_S = 1.0  # how often every routed server's /health is asked (a dead one leaves the routing)
MAX_PENDING = 100_000  # accounting records kept while the service is away
METER_LIMIT = 8 << 20  # a non-streamed answer is parsed for its usage up to this size
LINE_LIMIT = 1 << 20  # a streamed answer's line (an SSE event) longer than this is cut: the Meter holds one line
KEEP_ALIVE_S = 5.0  # a streamed request waiting for its model to start gets an SSE comment this often
PASS_HEADERS = ("Content-Type", "Accept")
# The routes relayed to llama-server: its OpenAI- and Anthropic-compatible inference routes (docs/gateway.md), by
# their exact path. Not its own routes (/slots, /props, /metrics, /v1/chat/completions/control, /v1/stream, ...):
# they show or change other members' requests. Audio transcriptions are multipart, with no JSON `model`: not here.
RELAYED = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages",
           "/v1/rerank", "/v1/reranking", "/v1/chat/completions/input_tokens", "/v1/responses/input_tokens",
           "/v1/messages/count_tokens")
UNKEYED = ("/health", "/metrics")  # /metrics answers on loopback only; every other route asks for a key
KEY = web.RequestKey("key", dict)  # the request's key, set by the door


class Cut(Refused):
    """Refused, and the connection closed once the answer is out: what is left of its body is not read."""


log = logging.getLogger(__name__)


def error_body(status: int, message: str, kind: str, code: str, retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return web.json_response({"error": {"message": message, "type": kind, "code": code}}, status=status, headers=headers)


@dataclass
class Meter:
    """The tokens in an answer: llama-server's `usage` (or `timings`), streamed (SSE lines) or not; with the
    upstream's status, the time to its first byte and whether it was relayed whole. Made by the handler, so what was
    metered is accounted even when the client leaves (the handler is cancelled) after the last byte."""
    streamed: bool | None  # None: a non-streamed answer too large to parse, its tokens unknown
    prompt: int = 0
    completion: int = 0
    status: int | None = None
    ttft: float | None = None
    done: bool = False  # the whole answer was relayed: [DONE] streamed, or Content-Length bytes
    overlong: bool = False  # a streamed line passed LINE_LIMIT: the relay cuts the stream
    expected: int | None = None
    size: int = 0
    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        self.size += len(chunk)
        if self.expected is not None and self.size >= self.expected:
            self.done = True
        if not self.streamed:
            if len(self._buffer) > METER_LIMIT:
                self._buffer.clear()
                self.streamed = None  # too large to parse: counted as unknown
            return
        *lines, rest = self._buffer.split(b"\n")
        if len(rest) > LINE_LIMIT:  # an endless line is not kept
            self.overlong = True
            rest = bytearray()
        self._buffer = bytearray(rest)
        for line in lines:
            data = _data(line)
            if data is None:
                continue
            if data.rstrip() == b"[DONE]":
                self.done = True
            elif data.startswith(b"{") and (b'"usage"' in data or b'"timings"' in data):
                self._take(data)

    def finish(self) -> None:
        if self.streamed is False and self._buffer:
            self._take(bytes(self._buffer))
        elif self.streamed and (data := _data(bytes(self._buffer))) is not None and data.startswith(b"{"):
            self._take(data)

    def _take(self, text: bytes | bytearray) -> None:
        try:
            doc = json.loads(text)
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        usage, timings = doc.get("usage"), doc.get("timings")
        inner = doc.get("message") or doc.get("response")
        if usage is None and isinstance(inner, dict):  # Anthropic's message_start, the Responses API's response.completed
            usage = inner.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.prompt, self.completion = int(usage.get("prompt_tokens") or 0), usage["completion_tokens"]
        elif isinstance(usage, dict) and isinstance(usage.get("output_tokens"), int):
            # /v1/responses and /v1/messages. The Responses API's input_tokens counts the cached ones; Anthropic's does
            # not (cache_read_input_tokens), and its message_delta says only the output so far.
            if isinstance(usage.get("input_tokens"), int):
                self.prompt = usage["input_tokens"] + int(usage.get("cache_read_input_tokens") or 0) \
                    + int(usage.get("cache_creation_input_tokens") or 0)
            self.completion = usage["output_tokens"]
        elif isinstance(timings, dict) and isinstance(timings.get("predicted_n"), int):
            self.prompt = int(timings.get("prompt_n") or 0) + int(timings.get("cache_n") or 0)
            self.completion = timings["predicted_n"]
        elif isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):  # /v1/embeddings: a prompt only
            self.prompt, self.completion = usage["prompt_tokens"], 0


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("board_gateway_requests", "Requests answered, by user, model and HTTP status",
                                ["user", "model", "code"], registry=self.registry)
        self.prompt = Counter("board_gateway_prompt_tokens", "Prompt tokens, by user and model", ["user", "model"],
                              registry=self.registry)
        self.completion = Counter("board_gateway_completion_tokens", "Completion tokens, by user and model",
                                  ["user", "model"], registry=self.registry)
        buckets = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
        self.latency = Histogram("board_gateway_request_duration_seconds", "From the request to the answer's end",
                                 ["model"], buckets=buckets, registry=self.registry)
        self.waiting = Gauge("board_gateway_waiting_requests", "Requests waiting for a free slot now",
                             registry=self.registry)
        self.ttft = Histogram("board_gateway_time_to_first_token_seconds", "From the request to the first byte back",
                              ["model"], buckets=buckets, registry=self.registry)
        self.cold_starts = Counter("board_gateway_cold_starts", "Catalog models started for a request, by alias",
                                   ["model"], registry=self.registry)
        self.cold_start_seconds = Histogram(
            "board_gateway_cold_start_seconds", "From asking the service to start a catalog model to its server taking"
            " requests", ["model"], buckets=(1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600), registry=self.registry)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class Gateway:
    def __init__(self, config: Config, client, clock=time.time) -> None:
        settings = config.gateway
        self.config, self.settings, self.client, self.clock = config, settings, client, clock
        self.router = Router(settings.drain_s, settings.queue_timeout_s, settings.max_concurrent_per_user, clock,
                             shares={p.name: p.share for p in config.projects},
                             half_life_s=config.policy.fair_share_half_life_days * 86400)
        self.limits = Limits(config, clock)
        self.fair_seeded = not config.projects  # the projects' past use, once, from the first state that has it
        self.metrics = Metrics()
        self.demand = Demand(config, client, self.router, self.metrics)
        self.pending: list[dict] = []
        # Each record's id, unique across the gateway's restarts: the service records a batch sent twice once.
        self._boot, self._requests = secrets.token_hex(8), itertools.count(1)
        self.session: aiohttp.ClientSession  # opened in _start: aiohttp's session wants the running loop
        self.stopping = threading.Event()
        open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.max_connections = settings.max_connections if open_files == resource.RLIM_INFINITY else \
            connection_cap(settings.max_connections, open_files)
        self.connections = Connections(self.max_connections, settings.max_connections_per_address,
                                       settings.head_timeout_s, settings.idle_timeout_s)

    # -- the application -------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=int(self.settings.max_body_mb * (1 << 20)), middlewares=[self._door])
        app.router.add_get("/health", self.health, allow_head=False)
        app.router.add_get("/metrics", self.prometheus, allow_head=False)
        app.router.add_get("/v1/models", self.list_models, allow_head=False)
        for path in RELAYED:
            app.router.add_post(path, self.relay)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            # A connection per upstream request, never kept: llama-server (cpp-httplib, a thread per connection) drops
            # kept-alive connections as it likes, and a request sent on one as it does failed with a 502
            # (ServerDisconnectedError), about one in five in tests/llama/test_gateway.py; an idle one held here would
            # also hold one of its few HTTP threads.
            connector=aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=300, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10), auto_decompress=False)
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._follow, args=(loop,), name="gateway-follow", daemon=True).start()
        self._flusher = asyncio.create_task(self._flush_loop())
        self._rechecker = asyncio.create_task(self._recheck_loop())

    async def _stop(self, app: web.Application) -> None:
        self.stopping.set()
        self._flusher.cancel()
        self._rechecker.cancel()
        await self._flush()
        self.client.close()
        await self.session.close()

    # -- the service -----------------------------------------------------------------------------

    def _follow(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read gateway_state now and at each change; across a restart of the service the last state stands."""
        def refresh() -> None:
            try:
                # The past use that orders the projects is read once (a read over the fair-share lookback).
                state = self.client.call("gateway_state", **({} if self.fair_seeded else {"fair_use": True}))
            except BoardError as error:
                log.warning(f"board gateway: cannot read the service's state: {error}")
                return
            try:
                loop.call_soon_threadsafe(self._update, state)
            except RuntimeError:  # the gateway stopped (its loop closed) while the state was being read
                return

        refresh()
        for event in self.client.subscribe(("gateway",)):
            if self.stopping.is_set():
                return
            kind = event.get("event")
            if kind in ("gateway", "reconnected"):
                refresh()
            elif kind == "down":
                log.warning(f"board gateway: lost the service ({event.get('message')}); routing on the last state"
                            " until it is back")

    def _update(self, state: dict) -> None:
        self.router.update(state)
        self.demand.updated()
        self.limits.seed(state.get("tokens_today"))
        if not self.fair_seeded and isinstance(state.get("fair_use"), dict):
            for project, tokens in state["fair_use"].items():  # what the service recorded before this gateway began
                self.router.queue.charged(project, tokens, state["now"])
            self.fair_seeded = True

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self._flush()
            await self.demand.touch()

    async def _recheck_loop(self) -> None:
        """Each RECHECK_S every routed server's /health is asked: one that refuses the connection (its llama-server
        died, whatever the service has heard yet) leaves the routing before a request meets it; one marked down
        comes back at its first 200; those the service no longer lists are forgotten."""
        while True:
            await asyncio.sleep(RECHECK_S)
            servers = list(self.router.servers.values())
            statuses = await asyncio.gather(*(self._health(server) for server in servers))
            for server, status in zip(servers, statuses):
                if server.id in self.router.down and status == 200:
                    self.router.up(server.id)
                    log.info(f"board gateway: server {server.id} ({server.alias}) answers again")
                elif server.id not in self.router.down and status is None:
                    self.router.down.add(server.id)
                    log.warning(f"board gateway: server {server.id} ({server.alias}) refuses connections: out of the"
                                " routing until it answers")
            self.router.down &= set(self.router.servers)

    async def _health(self, server: Upstream) -> int | None:
        """The status of the server's /health; None when nothing listens on its port, 0 for any other failure (a
        busy or slow server is not taken out for it)."""
        try:
            async with self.session.get(server.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as answer:
                return answer.status
        except aiohttp.ClientConnectorError:
            return None
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return 0

    async def _flush(self) -> None:
        while self.pending:
            batch, self.pending = self.pending[:1000], self.pending[1000:]
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, functools.partial(self.client.call, "gateway_usage", records=batch))
            except BadInput as error:  # refused as it is: sent again, it would be refused again, and block the rest
                log.error(f"board gateway: accounting refused by the service, {len(batch)} records dropped: {error}")
            except BoardError as error:  # the service is away: the batch waits for it, ahead of the newer records
                self.pending[:0] = batch[:MAX_PENDING - len(self.pending)]
                log.warning(f"board gateway: accounting kept for later ({len(self.pending)} records): {error}")
                return

    # -- the door --------------------------------------------------------------------------------

    @web.middleware
    async def _door(self, request: web.Request, handler) -> web.StreamResponse:
        """Only the route table's paths, exactly as sent: a path that is not already normal (`..`, `.`, `//`, or
        any of them percent-encoded) is 404 and goes nowhere, even where aiohttp would resolve it to a route. Then
        the key, on every route but UNKEYED: a new route is keyed without asking."""
        self.connections.busy(request.transport)  # its head is read: the head clock stops
        try:
            path = request.raw_path.partition("?")[0]
            info = request.match_info
            canonical = info.route.resource.canonical if info.route.resource is not None else None
            if info.http_exception is not None or path != canonical:
                if isinstance(info.http_exception, web.HTTPMethodNotAllowed) and path == request.path:
                    return error_body(405, f"{path} takes {', '.join(sorted(info.http_exception.allowed_methods))},"
                                           f" not {request.method[:10]}", "invalid_request_error", "method_not_allowed")
                return error_body(404, f"no route {inert(path, 80)}: the gateway serves GET /v1/models and POST"
                                       " /v1/chat/completions, /v1/completions, /v1/embeddings and the rest of"
                                       " docs/gateway.md's list", "invalid_request_error", "not_found")
            if canonical not in UNKEYED:
                try:
                    request[KEY] = self.router.authorise(self._hash(request), None)
                except Refused as refused:
                    self._account(request, None, None, None, refused.status, None, time.monotonic())
                    return error_body(refused.status, refused.message, refused.kind, refused.code, refused.retry_after)
            return await handler(request)
        finally:
            self.connections.done(request.transport)

    # -- endpoints -------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        models = self.router.models()
        return web.json_response({"status": "ok" if self.router.known else "starting", "service": self.router.known,
                                  "models": sorted(models), "servers": len(self.router.servers)},
                                 status=200 if self.router.known else 503)

    async def prometheus(self, request: web.Request) -> web.Response:
        if request.remote not in ("127.0.0.1", "::1"):  # who used what is the team's, not the internet's
            return error_body(403, "/metrics answers only on this host (scrape it through 127.0.0.1)",
                              "invalid_request_error", "forbidden")
        self.metrics.waiting.set(self.router.waiting())
        return web.Response(body=self.metrics.text(), content_type="text/plain", charset="utf-8")

    def _hash(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        return key_hash(token.strip()) if scheme.lower() == "bearer" and token.strip() else None

    async def list_models(self, request: web.Request) -> web.Response:
        key = request[KEY]
        data: list[dict[str, Any]] = []
        for alias, servers in sorted(self.router.models().items()):
            if key.get("models") is not None and alias not in key["models"]:
                continue
            ends = [s.booking_end for s in servers if s.booking_end is not None]
            data.append({"id": alias, "object": "model", "created": 0,
                         "owned_by": self.router.owned_by(alias),
                         "board": {"servers": [s.id for s in servers], "cards": sorted(c for s in servers for c in s.cards),
                                   "booking_end": max(ends) if ends else None,
                                   "slots": sum(s.parallel for s in servers)}})
            if alias in self.demand.catalog:
                data[-1]["board"].update(on_demand=True, state=self.demand.state(alias))
        for alias, entry in self.demand.catalog.items():  # the catalog's others: started when asked
            if alias in self.router.models() or (key.get("models") is not None and alias not in key["models"]):
                continue
            data.append({"id": alias, "object": "model", "created": 0, "owned_by": entry.project or "catalog",
                         "board": {"servers": [], "cards": [], "booking_end": None, "slots": 0, "on_demand": True,
                                   "state": self.demand.state(alias)}})
        return web.json_response({"object": "list", "data": data})

    async def relay(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        key, model, server, status, meter = None, None, None, 500, None
        early: list[web.StreamResponse] = []  # a streamed request's head, sent while its model starts
        try:
            key = request[KEY]
            body = await self._body(request)
            model = _model_of(body)
            if self.settings.log_bodies:
                log.info(f"board gateway: request body ({key['fingerprint']}): {body[:4096].decode('utf-8', 'replace')!r}")
            if model is None:
                raise Refused(400, "say which model: the request's \"model\" field (GET /v1/models lists them)",
                              "invalid_request_error", "model_required")
            self.router.authorise(self._hash(request), model)
            admitted = self.limits.admit(key)  # Refused 429 over a budget or a rate limit
            with contextlib.ExitStack() as using:  # a catalog alias is kept in use while its requests last
                try:
                    if model in self.demand.catalog:
                        using.enter_context(self.demand.using(model))
                        waiting = functools.partial(self._keep_alive, request, early) if _streamed(body) else quietly
                        answered, server = await self.demand.admit(model, key, waiting)
                        if answered != model:  # a fallback answers, and its reply's "model" says so
                            body, model = _with_model(body, answered), answered
                            if answered in self.demand.catalog:
                                using.enter_context(self.demand.using(answered))
                    else:
                        server = await self.router.admit(model, key)
                except BaseException:  # refused after all, or the client left: the request counts nothing
                    self.limits.cancel(admitted)
                    raise
                meter = Meter(streamed=False)
                try:
                    response, status = await self._forward(request, server, body, started, meter,
                                                           early[0] if early else None)
                    return response
                finally:
                    self.router.release(server, key, meter.prompt + meter.completion)
        except Refused as refused:
            status = refused.status
            if early:  # the head went out as 200: the refusal is the stream's one event
                await _error_event(early[0], refused.message, refused.kind, refused.code)
                return early[0]
            response = error_body(refused.status, refused.message, refused.kind, refused.code, refused.retry_after)
            if isinstance(refused, Cut):  # sent now, then closed: aiohttp would go on reading the body otherwise
                response.force_close()
                await response.prepare(request)
                await response.write_eof()
                request.protocol.force_close()
            return response
        except asyncio.CancelledError:
            # The client left: its upstream request was closed with it, unless it had the whole answer already.
            if meter is not None and meter.done and meter.status is not None:  # done: its status came first
                meter.finish()
                status = meter.status
            else:
                status = 499
            raise
        finally:
            self._account(request, key, model, server, status, meter, started)

    @contextlib.asynccontextmanager
    async def _keep_alive(self, request: web.Request, early: list[web.StreamResponse], alias: str, reply: dict):
        """A streamed request whose model is starting: its 200 event-stream head goes at once, then a comment every
        KEEP_ALIVE_S (SSE clients skip lines that begin with ':'), so that neither the client nor a proxy between
        gives up on a silent connection while the server loads."""
        if not early:
            response = web.StreamResponse(status=200, headers={
                "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            await response.prepare(request)
            early.append(response)
        cards = [c for c in reply.get("cards") or () if isinstance(c, int)]
        from app.core.ical import card_ranges

        where = f" on {'card' if len(cards) == 1 else 'cards'} {card_ranges(cards)}" if cards else ""
        line = f": board: starting {alias}{where}\n\n".encode()

        async def beat() -> None:
            with contextlib.suppress(ConnectionError, RuntimeError):  # the client left: its handler is cancelled
                while True:
                    await early[0].write(line)
                    await asyncio.sleep(KEEP_ALIVE_S)

        beating = asyncio.create_task(beat())
        try:
            yield
        finally:
            beating.cancel()

    async def _body(self, request: web.Request) -> bytes:
        limit = int(self.settings.max_body_mb * (1 << 20))
        if request.content_length is not None and request.content_length > limit:
            raise Refused(413, f"the request is over {self.settings.max_body_mb:g} MB ([gateway] max_body_mb)",
                          "invalid_request_error", "request_too_large")
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise Refused(413, f"the request is over {self.settings.max_body_mb:g} MB ([gateway] max_body_mb)",
                          "invalid_request_error", "request_too_large") from None
        except TimeoutError:
            raise Cut(408, f"the request's body did not arrive within {self.settings.body_timeout_s:g} s"
                               " ([gateway] body_timeout_s)", "invalid_request_error", "request_timeout") from None
        except web.RequestPayloadError:
            raise Cut(400, "the body could not be read as its Content-Encoding says (send it as it is, or"
                               " compressed as the header says)", "invalid_request_error", "invalid_body") from None

    async def _forward(self, request: web.Request, server: Upstream, body: bytes, started: float, meter: Meter,
                       early: web.StreamResponse | None = None):
        """Relay the server's answer; `early`: the event-stream head already sent (app.gateway.demand's wait), into
        which an answer that is not a 200 stream goes as one event."""
        headers = {name: request.headers[name] for name in PASS_HEADERS if name in request.headers}
        headers["Accept-Encoding"] = "identity"  # relayed and metered as it comes, with no Content-Encoding passed on
        if server.api_key:
            headers["Authorization"] = f"Bearer {server.api_key}"
        resource = request.match_info.route.resource
        assert resource is not None  # relay is reached only through the routes Gateway.app added
        try:
            # The route's own path, never the client's: the door let through only exact route paths, and no query
            upstream = await self.session.request(request.method, server.url + resource.canonical,
                                                  data=body or None, headers=headers)
        except (aiohttp.ClientError, OSError) as error:
            if isinstance(error, aiohttp.ClientConnectorError):  # nothing listens: out of the routing at once
                self.router.down.add(server.id)
                log.warning(f"board gateway: server {server.id} ({server.alias}) refused the connection: not routed"
                            " until it answers")
            raise Refused(502, f"server {server.id} ({server.alias}) did not answer: {type(error).__name__}",
                          "server_error", "upstream_unavailable", retry_after=1) from None
        async with upstream:
            kind = upstream.headers.get("Content-Type", "application/json")
            streamed = "event-stream" in kind
            if early is not None and not (streamed and upstream.status == 200):
                return await self._one_event(early, upstream, server, meter)
            if early is not None:
                response = early
            else:
                response = web.StreamResponse(status=upstream.status, headers={"Content-Type": kind})
                if streamed:
                    response.headers["Cache-Control"] = "no-cache"
                    response.headers["X-Accel-Buffering"] = "no"  # a proxy in front must not hold the chunks either
                elif upstream.content_length is not None:
                    response.content_length = upstream.content_length
                await response.prepare(request)
            meter.streamed, meter.status = streamed, upstream.status
            meter.expected = None if streamed else upstream.content_length
            try:
                async for chunk in upstream.content.iter_any():
                    if meter.ttft is None:
                        meter.ttft = time.monotonic() - started
                    meter.feed(chunk)
                    if meter.overlong:
                        log.warning(f"board gateway: server {server.id} ({server.alias}) streamed a line over"
                                    f" {LINE_LIMIT >> 20} MB: cut")
                        await response.write(b"\n\ndata: " + json.dumps({"error": {
                            "message": f"server {server.id} ({server.alias}) sent a line over {LINE_LIMIT >> 20} MB;"
                                       " the gateway cut the stream", "type": "server_error",
                            "code": "upstream_line_too_long"}}).encode() + b"\n\n")
                        return response, 502
                    await response.write(chunk)
            except aiohttp.ClientError:
                log.warning(f"board gateway: server {server.id} ({server.alias}) broke off its answer")
                return response, 502
            meter.finish()
            meter.done = True
            await response.write_eof()
            return response, upstream.status

    async def _one_event(self, early: web.StreamResponse, upstream: aiohttp.ClientResponse, server: Upstream,
                         meter: Meter) -> tuple[web.StreamResponse, int]:
        """An answer that is not a 200 stream, into a stream whose head went out already: a 200's body as one data
        event, an error status as an error event (the server's own error where it sent one)."""
        meter.status = upstream.status
        read = bytearray()
        async for chunk in upstream.content.iter_any():  # whole, up to what the meter parses
            read += chunk
            if len(read) > METER_LIMIT:
                break
        text = bytes(read)
        if upstream.status == 200:
            meter.feed(text)
            meter.finish()
            meter.done = True
            await early.write(b"data: " + text.replace(b"\n", b"") + b"\n\n")
            await early.write_eof()
            return early, 200
        try:
            error = json.loads(text).get("error")
        except (ValueError, AttributeError):
            error = None
        if not isinstance(error, dict):
            error = {"message": f"server {server.id} ({server.alias}) answered {upstream.status}",
                     "type": "server_error", "code": "upstream_error"}
        await _error_event(early, str(error.get("message")), str(error.get("type")), str(error.get("code")))
        return early, upstream.status

    def _account(self, request, key, model, server, status, meter, started) -> None:
        duration = time.monotonic() - started
        user = key["user"] if key else ""
        known = model if model in self.router.models() or model in self.demand.catalog \
            or any(p.get("alias") == model for p in self.router.planned) else ("" if model is None else "other")
        self.metrics.requests.labels(user, known, str(status)).inc()
        prompt, completion = (meter.prompt, meter.completion) if meter else (0, 0)
        ttft = meter.ttft if meter else None
        if key is not None:
            self.limits.spend(key, prompt + completion)
            self.metrics.prompt.labels(user, known).inc(prompt)
            self.metrics.completion.labels(user, known).inc(completion)
            self.metrics.latency.labels(known).observe(duration)
            if ttft is not None:
                self.metrics.ttft.labels(known).observe(ttft)
            if len(self.pending) < MAX_PENDING:
                self.pending.append({
                    "ts": int(self.clock()), "key_id": key["id"], "fingerprint": key["fingerprint"], "user": user,
                    "model": known, "server_id": server.id if server else None, "status": status,
                    "prompt_tokens": prompt, "completion_tokens": completion,
                    "ttft_ms": round(ttft * 1000) if ttft is not None else None, "duration_ms": round(duration * 1000),
                    "request": f"{self._boot}-{next(self._requests)}",
                    **({"project": key["project"]} if key.get("project") else {})})  # a board without projects: as before
        log.info(f"board gateway: {request.method} {request.path} {status} model={known or '-'} user={user or '-'}"
                 f" key={key['fingerprint'] if key else '-'} server={server.id if server else '-'}"
                 f" tokens={prompt}+{completion} {duration * 1000:.0f}ms")


def _data(line: bytes | bytearray) -> bytes | bytearray | None:
    """An SSE line's data, or None for another field: "data:" and the one space after it that the format allows to
    leave out (`data:{...}`)."""
    if not line.startswith(b"data:"):
        return None
    return line[6:] if line.startswith(b"data: ") else line[5:]


async def _error_event(response: web.StreamResponse, message: str, kind: str, code: str) -> None:
    """The stream's end: one error event in OpenAI's shape (the head went out as 200 already)."""
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write(b"data: " + json.dumps({"error": {"message": message, "type": kind, "code": code}})
                             .encode() + b"\n\n")
        await response.write_eof()


def _streamed(body: bytes) -> bool:
    """The request asks for a stream ("stream": true); its body is JSON already (_model_of read it)."""
    doc = json.loads(body)
    return isinstance(doc, dict) and doc.get("stream") is True


def _with_model(body: bytes, model: str) -> bytes:
    """The body with its "model" rewritten (a fallback answers under its own name)."""
    doc = json.loads(body)
    doc["model"] = model
    return json.dumps(doc).encode()


def _model_of(body: bytes) -> str | None:
    if not body:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise Refused(400, "the body is not JSON", "invalid_request_error", "invalid_json") from None
    model = doc.get("model") if isinstance(doc, dict) else None
    return model if isinstance(model, str) and model else None


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


class WatchedSite(web.TCPSite):
    """aiohttp's TCP site, each connection counted and timed (app.gateway.connections). asyncio's accept already
    backs off (1 s) when it runs out of files (EMFILE) and then serves on; the caps keep it from getting there."""

    def __init__(self, runner: web.AppRunner, connections: Connections, *args, **kwargs) -> None:
        super().__init__(runner, *args, **kwargs)
        self.connections = connections

    async def start(self) -> None:
        await web.BaseSite.start(self)
        assert self._runner.server is not None  # as TCPSite.start: the runner was set up first
        self._server = await asyncio.get_running_loop().create_server(
            self.connections.wrap(self._runner.server), self._host, self._port, backlog=self._backlog,
            reuse_address=self._reuse_address)
        self._bound_port = self._server.sockets[0].getsockname()[1]


async def open_site(gateway: Gateway, listen: str) -> tuple[web.AppRunner, WatchedSite]:
    """The gateway listening (port 0: any free one, site.port says which); runner.cleanup() closes it."""
    # aiohttp's own keep-alive clock is only a backstop, set well after ours (Connections), which counts the cut:
    # it starts when a connection opens, so at the same length it would be first in the loop's queue whenever the
    # loop runs late, and its default (3630 s) would cut a longer idle_timeout_s short.
    runner = web.AppRunner(gateway.app(), handler_cancellation=True, access_log=None,
                           keepalive_timeout=2 * gateway.settings.idle_timeout_s + 1)
    await runner.setup()
    host, port = _listen(listen)
    site = WatchedSite(runner, gateway.connections, host, port, reuse_address=True, backlog=BACKLOG)
    await site.start()
    return runner, site


async def serve(gateway: Gateway, listen: str, ready: asyncio.Event | None = None) -> None:
    runner, _ = await open_site(gateway, listen)
    log.info(f"board gateway: listening on {listen}, for the service at {gateway.client.path}; at most"
             f" {gateway.max_connections} connections, {gateway.settings.max_connections_per_address} per address")
    if gateway.max_connections < gateway.settings.max_connections:
        log.warning(f"board gateway: [gateway] max_connections is {gateway.settings.max_connections}, but the"
                    f" open-file limit holds {gateway.max_connections} beside their upstreams; raise LimitNOFILE= in"
                    " the unit")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("board gateway: stopping")
    await runner.cleanup()


def run_gateway(config: Config, listen: str | None = None) -> int:
    """`board gateway`: serve until SIGTERM. It needs the service's socket ([service] socket): it has no database."""
    from app.client.socket import SocketClient
    from app.service.door.server import raise_file_limit

    if not config.service.socket:
        raise BadInput("[service] socket is not set: the gateway reaches the service only through its socket")
    if listen is not None:
        from app.config import host_port

        try:
            host_port(listen, "--listen", "0.0.0.0:8080")
        except ValueError as error:
            raise BadInput(str(error)) from None
    if config.gateway.log_bodies:
        log.warning("board gateway: [gateway] log_bodies is true: prompts and completions are logged")
    if "max_concurrent_per_key" in config.gateway._renamed:
        log.warning("board gateway: [gateway] max_concurrent_per_key is now max_concurrent_per_user"
                    f" ({config.gateway.max_concurrent_per_user}), counted across all of a member's keys; rename it"
                    " in the config")
    os.umask(0o077)
    raise_file_limit()  # the caps are sized from it (Gateway.max_connections)
    asyncio.run(serve(Gateway(config, SocketClient(config.service.socket)), listen or config.gateway.listen))
    return 0

"""What the gateway routes by, and who is admitted when: no HTTP here (app.gateway.server relays).

All of it runs on the gateway's one event loop, so nothing here takes a lock. A target is a URL and a key, so
a server on another host is one more target (its `host` field) when the fleet comes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from app.core.keys import class_rank


class Refused(Exception):
    """A request the gateway answers itself: an HTTP status, OpenAI's error type and code, one line to act on."""

    def __init__(self, status: int, message: str, kind: str, code: str, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.retry_after = status, message, kind, code, retry_after


@dataclass(eq=False)
class Upstream:
    id: int
    alias: str
    url: str
    api_key: str | None
    parallel: int
    user: str
    booking: int
    booking_end: int | None
    cards: list[int]
    state: str
    host: str = "local"
    outstanding: int = 0

    def draining(self, now: float, drain_s: float) -> bool:
        return self.booking_end is not None and self.booking_end - now <= drain_s


@dataclass(order=True)
class _Waiter:
    rank: int
    seq: int
    future: asyncio.Future = field(compare=False)
    alias: str = field(compare=False)


class Router:
    def __init__(self, drain_s: float, queue_timeout_s: float, max_per_key: int, clock) -> None:
        self.drain_s, self.queue_timeout_s, self.max_per_key, self.clock = drain_s, queue_timeout_s, max_per_key, clock
        self.servers: dict[int, Upstream] = {}
        self.planned: list[dict] = []
        self.keys: dict[str, dict] = {}  # hash -> key
        self.known = False  # gateway_state has been read at least once
        self.down: set[int] = set()  # servers that refused a connection: not routed until their /health answers
        self.in_flight: dict[int, int] = {}  # key id -> requests admitted or waiting
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()

    # -- the service's view --------------------------------------------------------------------

    def update(self, state: dict[str, Any]) -> None:
        """A new gateway_state. A server already known stays the same object, updated in place: the requests in flight
        on it hold that object, and their release must free a slot the router still counts."""
        servers = {}
        for s in state.get("servers", []):
            if s.get("state") not in ("ready",):
                continue
            upstream = Upstream(id=s["id"], alias=s["alias"], url=s["url"], api_key=s.get("api_key"),
                                parallel=max(1, int(s.get("parallel") or 1)), user=s["user"], booking=s["booking"],
                                booking_end=s.get("booking_end"), cards=list(s.get("cards") or []), state=s["state"],
                                host=s.get("host", "local"))
            current = self.servers.get(upstream.id)
            if current is not None:
                upstream.outstanding = current.outstanding
                vars(current).update(vars(upstream))
                upstream = current
            servers[upstream.id] = upstream
        self.servers = servers
        self.planned = list(state.get("planned", []))
        self.keys = {k["hash"]: k for k in state.get("keys", [])}
        self.known = True
        self._dispatch()

    def models(self) -> dict[str, list[Upstream]]:
        found: dict[str, list[Upstream]] = {}
        for server in self.servers.values():
            found.setdefault(server.alias, []).append(server)
        return found

    # -- keys -----------------------------------------------------------------------------------

    def authorise(self, hashed: str | None, model: str | None) -> dict:
        """The key for a request's Authorization hash; Refused 401 for none, 403 for a model out of its scope."""
        key = self.keys.get(hashed) if hashed else None
        if key is None or key.get("revoked") or (key.get("expires") is not None and key["expires"] <= self.clock()):
            if not self.known:
                raise Refused(503, "the gateway has not reached the board service yet; try again in a few seconds",
                              "server_error", "service_unavailable", retry_after=5)
            raise Refused(401, "no valid API key: send 'Authorization: Bearer <key>' with a key from 'board key new'"
                               " (revoked and expired keys stop working)", "invalid_request_error", "invalid_api_key")
        if model is not None and key.get("models") is not None and model not in key["models"]:
            raise Refused(403, f"key {key['fingerprint']} may use {', '.join(key['models'])}, not {model[:80]}",
                          "invalid_request_error", "model_not_allowed")
        return key

    # -- admission ------------------------------------------------------------------------------

    def _targets(self, alias: str) -> list[Upstream]:
        now = self.clock()
        return [s for s in self.servers.values()
                if s.alias == alias and not s.draining(now, self.drain_s) and s.id not in self.down]

    def _free(self, alias: str) -> Upstream | None:
        """Least outstanding requests among the model's servers with a free slot (fewest in flight per slot on ties)."""
        free = [s for s in self._targets(alias) if s.outstanding < s.parallel]
        return min(free, key=lambda s: (s.outstanding, s.outstanding / s.parallel, s.id), default=None)

    def _unserved(self, model: str) -> Refused:
        now = self.clock()
        planned = sorted((p for p in self.planned if p.get("alias") == model and (p.get("end") or 0) > now),
                         key=lambda p: p.get("start") or 0)
        if planned:
            from datetime import datetime  # start-up: only this refusal words a time

            first = planned[0]
            start = datetime.fromtimestamp(first["start"]).astimezone().strftime("%a %H:%M")
            wait = max(1, math.ceil(first["start"] - now))
            return Refused(503, f"{model[:80]} is served from {start} (booking {first['booking']}); try again then",
                           "server_error", "model_not_ready", retry_after=min(wait, 3600))
        if any(s.alias == model and s.id in self.down for s in self.servers.values()):
            return Refused(503, f"{model[:80]}'s servers do not answer (their llama-server is gone or restarting);"
                                " try again shortly", "server_error", "model_unavailable", retry_after=5)
        if any(s.alias == model for s in self.servers.values()):
            return Refused(503, f"{model[:80]}'s servers are stopping (their bookings end within {self.drain_s:g} s)",
                           "server_error", "model_draining", retry_after=max(1, math.ceil(self.drain_s)))
        served = ", ".join(sorted(self.models())) or "none"
        return Refused(404, f"no server serves {model[:80]!r}; served now: {served}", "invalid_request_error",
                       "model_not_found")

    async def admit(self, model: str, key: dict) -> Upstream:
        """A server with a free slot for this request, waiting in class order then first come, up to queue_timeout_s;
        Refused when no one serves the model, the key is at its cap, or the wait runs out. Release it after."""
        if not self._targets(model):
            raise self._unserved(model)
        key_id = key["id"]
        if self.in_flight.get(key_id, 0) >= self.max_per_key:
            raise Refused(429, f"key {key['fingerprint']} has {self.max_per_key} requests in flight, its limit"
                               " ([gateway] max_concurrent_per_key); wait for one to finish", "rate_limit_exceeded",
                          "too_many_requests_per_key", retry_after=1)
        self.in_flight[key_id] = self.in_flight.get(key_id, 0) + 1
        try:
            ahead = any(w.alias == model for w in self._waiting)  # those waiting already go first
            server = None if ahead else self._free(model)
            if server is not None:
                server.outstanding += 1
                return server
            waiter = _Waiter(class_rank(key.get("class")), next(self._seq),
                             asyncio.get_running_loop().create_future(), model)
            heapq.heappush(self._waiting, waiter)
            try:
                server = await asyncio.wait_for(asyncio.shield(waiter.future), self.queue_timeout_s)
            except asyncio.TimeoutError:
                self._forget(waiter)
                raise Refused(429, f"every slot of {model[:80]} is busy and the wait passed {self.queue_timeout_s:g} s;"
                                   " try again shortly", "rate_limit_exceeded", "model_busy",
                              retry_after=max(1, math.ceil(self.queue_timeout_s))) from None
            except BaseException:
                self._forget(waiter)
                raise
            return server  # _dispatch counted it
        except BaseException:
            self._done_key(key_id)
            raise

    def release(self, server: Upstream, key: dict) -> None:
        server.outstanding -= 1
        self._done_key(key["id"])
        self._dispatch()

    def up(self, server_id: int) -> None:
        """A server marked down answers again (or is gone from the state): routed again, its slots to the waiters."""
        self.down.discard(server_id)
        self._dispatch()

    def _done_key(self, key_id: int) -> None:
        left = self.in_flight.get(key_id, 1) - 1
        if left > 0:
            self.in_flight[key_id] = left
        else:
            self.in_flight.pop(key_id, None)

    def _forget(self, waiter: _Waiter) -> None:
        """A waiter that gave up (timed out, or its client left): out of the queue; a slot it was handed goes on."""
        if waiter in self._waiting:
            self._waiting.remove(waiter)
            heapq.heapify(self._waiting)
        elif waiter.future.done() and not waiter.future.cancelled():
            server = waiter.future.result()
            server.outstanding -= 1
            self._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to the waiters, best class first, then first come (per model)."""
        blocked: set[str] = set()
        kept = []
        while self._waiting:
            waiter = heapq.heappop(self._waiting)
            if waiter.future.done():
                continue
            server = None if waiter.alias in blocked else self._free(waiter.alias)
            if server is None:
                blocked.add(waiter.alias)
                kept.append(waiter)
                continue
            server.outstanding += 1  # the waiter's from now: _forget gives it back if the waiter has left
            waiter.future.set_result(server)
        for waiter in kept:
            heapq.heappush(self._waiting, waiter)

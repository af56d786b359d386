"""What the gateway routes by, and who is admitted when: no HTTP here (app.gateway.server relays).

All of it runs on the gateway's one event loop, so nothing here takes a lock. A target is a URL and a key, so
a server on another host is one more target (its `host` field) when the fleet comes.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping

from app.core.keys import class_rank
from app.core.projects import IMPLICIT
from app.gateway.waiting import Usage, WaitQueue, Waiter

logger = logging.getLogger(__name__)


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
    on_demand: str = ""  # the catalog alias its booking was made for ([[models]]); "" for a member's server
    outstanding: int = 0

    def draining(self, now: float, drain_s: float) -> bool:
        return self.booking_end is not None and self.booking_end - now <= drain_s


class Router:
    def __init__(self, drain_s: float, queue_timeout_s: float, max_per_user: int, clock,
                 shares: Mapping[str, float] | None = None, half_life_s: float = 7 * 86400.0) -> None:
        """`shares`: each project's fair-share weight ([[projects]] share); `half_life_s`: how fast a project's
        tokens stop counting against it ([policy] fair_share_half_life_days)."""
        self.drain_s, self.queue_timeout_s, self.max_per_user, self.clock = drain_s, queue_timeout_s, max_per_user, clock
        self.servers: dict[int, Upstream] = {}  # the ready servers the gateway routes to
        self.shut_out: dict[int, Upstream] = {}  # ready servers under an alias another member holds: never routed
        self.holders: dict[str, str] = {}  # a contested alias -> the one holder routed to
        self.team_aliases: dict[str, dict] = {}  # alias -> {"owners": [...], "holders": [...]} (gateway_state)
        self.planned: list[dict] = []
        self.keys: dict[str, dict] = {}  # hash -> key
        self.known = False  # gateway_state has been read at least once
        self.down: set[int] = set()  # servers that refused a connection: not routed until their /health answers
        # A member's requests admitted or waiting, across all their keys: keys are cheap, members are not.
        self.in_flight: dict[str, int] = {}
        self.queue = WaitQueue(Usage(half_life_s, shares or {}))  # requests waiting for a slot, in the order served
        self._watching: dict[str, set[asyncio.Future[None]]] = {}  # alias -> requests waiting for it to be routable
        self.starting: set[str] = set()  # the aliases of the servers the state lists as starting

    # -- the service's view --------------------------------------------------------------------

    def update(self, state: dict[str, Any]) -> None:
        """A new gateway_state. A server already known stays the same object, updated in place: the requests in flight
        on it hold that object, and their release must free a slot the router still counts."""
        servers = {}
        self.starting = {s["alias"] for s in state.get("servers", []) if s.get("state") == "starting"}
        for s in state.get("servers", []):
            if s.get("state") not in ("ready",):
                continue
            upstream = Upstream(id=s["id"], alias=s["alias"], url=s["url"], api_key=s.get("api_key"),
                                parallel=max(1, int(s.get("parallel") or 1)), user=s["user"], booking=s["booking"],
                                booking_end=s.get("booking_end"), cards=list(s.get("cards") or []), state=s["state"],
                                host=s.get("host", "local"), on_demand=s.get("on_demand", ""))
            current = self.servers.get(upstream.id) or self.shut_out.get(upstream.id)
            if current is not None:
                upstream.outstanding = current.outstanding
                vars(current).update(vars(upstream))
                upstream = current
            servers[upstream.id] = upstream
        self.team_aliases = {alias: team for alias, team in (state.get("team_aliases") or {}).items()
                             if isinstance(team, dict)}
        self.servers, self.shut_out = self._one_holder(servers)
        self.planned = list(state.get("planned", []))
        self.keys = {k["hash"]: k for k in state.get("keys", [])}
        self.known = True
        self._dispatch()
        self._wake()

    def _one_holder(self, servers: dict[int, Upstream]) -> tuple[dict[int, Upstream], dict[int, Upstream]]:
        """(routed, shut out): an alias's servers are one holder's, or a team alias's holders', even where the rows
        say otherwise (the service refuses such starts: app.llama.aliases). Of several holders of one alias, the one
        routed to keeps it while they serve it; else the holder of the oldest server (the smallest id) takes it."""
        by_alias: dict[str, list[Upstream]] = {}
        for server in sorted(servers.values(), key=lambda s: s.id):
            by_alias.setdefault(server.alias, []).append(server)
        routed, shut_out, holders = {}, {}, {}
        for alias, found in by_alias.items():
            users = {s.user for s in found}
            if alias in self.team_aliases:
                allowed = set(self.team_aliases[alias].get("holders") or ())
            else:
                holder = self.holders.get(alias)
                if holder not in users:
                    holder = found[0].user
                holders[alias], allowed = holder, {holder}
            for server in found:
                if server.user in allowed:
                    routed[server.id] = server
                    continue
                shut_out[server.id] = server
                if server.id not in self.shut_out:
                    why = "not among the team alias's owners" if alias in self.team_aliases else f"{holders[alias]}'s"
                    logger.warning("server %d (%s) serves alias %s, which is %s: not routed to", server.id,
                                   server.user, alias, why)
        self.holders = holders
        return routed, shut_out

    def owned_by(self, alias: str) -> str:
        """/v1/models's owned_by: a team alias's owners as the config lists them, else its holder."""
        if alias in self.team_aliases:
            return ",".join(self.team_aliases[alias].get("owners") or ())
        return ",".join(sorted({s.user for s in self.servers.values() if s.alias == alias}))

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

    def serves(self, alias: str) -> bool:
        """A server of `alias` takes requests now (ready, answering, not draining)."""
        return bool(self._targets(alias))

    async def served(self, alias: str) -> None:
        """Return once `alias` has a server that takes requests: woken by each new state (and each server back up),
        never polled. A started catalog model's requests wait here (app.gateway.demand). Refused model_unavailable
        when a server of it that the state listed as starting is gone without having been ready: it failed to
        start, and waiting on would last to the timeout."""
        seen = alias in self.starting
        while not self._targets(alias):
            future = asyncio.get_running_loop().create_future()
            self._watching.setdefault(alias, set()).add(future)
            try:
                await future
            finally:
                watchers = self._watching.get(alias, set())
                watchers.discard(future)
                if not watchers:
                    self._watching.pop(alias, None)
            if alias in self.starting:
                seen = True
            elif seen and alias not in self.models():
                raise Refused(503, f"{alias[:80]}'s server stopped before it was ready (its log says why: board serve"
                                   " logs); try again shortly", "server_error", "model_unavailable", retry_after=30)

    def _wake(self) -> None:
        """A new state: each request waiting for an alias looks again (app.gateway.demand)."""
        watching, self._watching = self._watching, {}
        for futures in watching.values():
            for future in futures:
                if not future.done():
                    future.set_result(None)

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
        """A server with a free slot for this request, waiting in app.gateway.waiting's order (class, the project's
        fair share, round-robin across members, first come) up to queue_timeout_s; Refused when no one serves the
        model, the member is at their cap, or the wait runs out. Release it after."""
        if not self._targets(model):
            raise self._unserved(model)
        user = key["user"]
        self.enter(user)
        try:
            ahead = self.queue.waiting(model)  # those waiting already go first
            server = None if ahead else self._free(model)
            if server is not None:
                self._hand(server, user, model)
                return server
            waiter = self.queue.push(class_rank(key.get("class")), project_of(key), user, model,
                                     asyncio.get_running_loop().create_future())
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
            self.leave(user)
            raise

    def enter(self, user: str) -> None:
        """Count a request of `user` in flight or waiting; Refused 429 when they are at their cap. `leave` after."""
        if self.in_flight.get(user, 0) >= self.max_per_user:
            raise Refused(429, f"{user} has {self.max_per_user} requests in flight or waiting, the limit per member"
                               " across all their keys ([gateway] max_concurrent_per_user); wait for one to finish",
                          "rate_limit_exceeded", "too_many_requests_per_user", retry_after=1)
        self.in_flight[user] = self.in_flight.get(user, 0) + 1

    def release(self, server: Upstream, key: dict, tokens: int = 0) -> None:
        """The request's slot is free again; its `tokens` (prompt and completion) count against its project's share."""
        server.outstanding -= 1
        self.leave(key["user"])
        self.queue.charged(project_of(key), tokens, self.clock())
        self._dispatch()

    def up(self, server_id: int) -> None:
        """A server marked down answers again (or is gone from the state): routed again, its slots to the waiters."""
        self.down.discard(server_id)
        self._dispatch()
        self._wake()

    def waiting(self) -> int:
        """Requests waiting for a slot now (the gateway's /metrics shows it)."""
        return len(self.queue)

    def _hand(self, server: Upstream, user: str, alias: str) -> None:
        """A slot of `server` is the user's request's from now: counted, and their turn on the model marked."""
        server.outstanding += 1
        self.queue.served(user, alias)

    def leave(self, user: str) -> None:
        left = self.in_flight.get(user, 1) - 1
        if left > 0:
            self.in_flight[user] = left
        else:
            self.in_flight.pop(user, None)
            self.queue.gone(user)  # nothing in flight: they come back as new

    def _forget(self, waiter: Waiter) -> None:
        """A waiter that gave up (timed out, or its client left): out of the queue; a slot it was handed goes on."""
        if self.queue.remove(waiter):
            return
        if waiter.future.done() and not waiter.future.cancelled():
            server = waiter.future.result()
            server.outstanding -= 1
            self._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to the waiters, in the queue's order (per model: a model whose slots are full holds back
        no other)."""
        for alias in self.queue.aliases():
            while self.queue.waiting(alias) and (server := self._free(alias)) is not None:
                waiter = self.queue.pop(alias)
                assert waiter is not None  # one waits for alias
                self._hand(server, waiter.user, alias)  # the waiter's from now: _forget gives it back if it has left
                waiter.future.set_result(server)


def project_of(key: dict) -> str:
    """The key's project (gateway_state's keys carry it); IMPLICIT for a key of a board without [[projects]]."""
    return key.get("project") or IMPLICIT

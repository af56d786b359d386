"""The team catalog's models started on demand ([[models]]): the gateway's side (docs/gateway.md, "Models on demand").

A keyed request for a catalog alias that no server takes asks the service to start it (`model_demand`: it books
free cards of the entry's pool, the runner starts the server) and then waits for a ready server of the alias in the
router's state, up to [llama] ready_timeout_s + READY_MARGIN_S. One `model_demand` per alias is in flight at a time:
the requests that come meanwhile share its reply, so two clients at once start one server. An alias the service
cannot start ("unavailable": nothing free, no runner, the budget), or one whose slots stay busy past the queue's
wait, hands the request to its fallbacks in order; with none that answers, 503 `no_free_cards` with the service's
Retry-After and its one line. While an alias has requests in flight or waiting, and once more after they end, it is
touched (`models_touch`, each FLUSH_S): that keeps its booking's lease; idle for ttl_s, the service lets it go.

No HTTP here (app.gateway.server relays, and writes a streamed request's keep-alive comments while it waits), and no
lock: it all runs on the gateway's one event loop; the service is called in the loop's executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, AsyncContextManager

from app.config import Config
from app.errors import BadInput, BoardError
from app.gateway.routing import Refused, Router, Upstream

READY_MARGIN_S = 10.0  # past [llama] ready_timeout_s: the runner's start and the state's push take a moment too
UNKNOWN_RETRY_S = 60  # Retry-After when the service names no time

log = logging.getLogger(__name__)

# What a request does while it waits for a started alias (alias, the service's reply): a streamed one sends its head
# and keep-alive comments (app.gateway.server).
Waiting = Callable[[str, dict[str, Any]], AsyncContextManager[None]]


@contextlib.asynccontextmanager
async def quietly(alias: str, reply: dict[str, Any]):
    """A request that waits without a word (not streamed)."""
    yield


class Demand:
    def __init__(self, config: Config, client, router: Router, metrics) -> None:
        self.catalog = {entry.alias: entry for entry in config.models}
        self.client, self.router, self.metrics = client, router, metrics
        self.wait_s = config.llama.ready_timeout_s + READY_MARGIN_S
        self.calls: dict[str, asyncio.Future[dict[str, Any]]] = {}  # alias -> its model_demand in flight
        self.busy: Counter[str] = Counter()  # alias -> its requests in flight or waiting
        self.used: set[str] = set()  # aliases whose requests ended since the last touch
        self.starts: dict[str, tuple[int | None, float]] = {}  # alias -> (booking, asked at): started, not yet ready

    # -- admission ------------------------------------------------------------------------------

    async def admit(self, model: str, key: dict, waiting: Waiting = quietly) -> tuple[str, Upstream]:
        """(the alias that answers, a slot of its server) for a request of catalog alias `model`: its own server,
        started if need be, else its fallbacks in order; Refused when none answers. Release the slot after, as
        any (Router.release)."""
        refused = None
        if self.router.serves(model):
            try:
                return model, await self.router.admit(model, key)
            except Refused as busy:
                if busy.code != "model_busy":
                    raise
                refused = busy
        else:
            try:
                return model, await self._start(model, key, waiting)
            except Refused as cold:
                if cold.code not in ("no_free_cards", "service_unavailable", "model_unavailable"):
                    raise
                refused = cold
        for fallback in self.catalog[model].fallbacks:
            if key.get("models") is not None and fallback not in key["models"]:
                continue  # out of the key's scope: never answered by way of another alias
            try:
                if self.router.serves(fallback):
                    return fallback, await self.router.admit(fallback, key)
                if fallback in self.catalog:
                    return fallback, await self._start(fallback, key, waiting)
            except Refused as failed:
                if failed.code not in ("model_busy", "no_free_cards", "service_unavailable", "model_unavailable",
                                       "model_draining"):
                    raise
        raise refused

    async def _start(self, alias: str, key: dict, waiting: Waiting) -> Upstream:
        """Ask the service for `alias` and wait for its server; Refused no_free_cards where it cannot start it."""
        reply = await self.ask(alias)
        if reply.get("state") not in ("starting", "ready"):
            raise Refused(503, str(reply.get("message") or f"{alias} cannot be started now"), "server_error",
                          "no_free_cards", retry_after=_seconds(reply.get("retry_after")))
        if not self.router.serves(alias):
            self.router.enter(key["user"])  # a member's waiting requests count against their cap, as queued ones do
            try:
                async with waiting(alias, reply), asyncio.timeout(self.wait_s):
                    await self.router.served(alias)
            except TimeoutError:
                raise Refused(503, f"{alias} did not start within {self.wait_s:g} s ([llama] ready_timeout_s +"
                                   f" {READY_MARGIN_S:g} s); try again shortly", "server_error", "model_not_ready",
                              retry_after=5) from None
            finally:
                self.router.leave(key["user"])
        return await self.router.admit(alias, key)

    async def ask(self, alias: str) -> dict[str, Any]:
        """The service's model_demand reply for `alias`. Concurrent askers share one call: a client that leaves
        cancels only its own wait for it."""
        call = self.calls.get(alias)
        if call is None:
            call = self.calls[alias] = asyncio.ensure_future(self._demand(alias))
            call.add_done_callback(functools.partial(self._asked, alias))
        return await asyncio.shield(call)

    def _asked(self, alias: str, call: asyncio.Future) -> None:
        if self.calls.get(alias) is call:
            del self.calls[alias]
        if not call.cancelled():
            call.exception()  # seen, whether or not a request was left to await it

    async def _demand(self, alias: str) -> dict[str, Any]:
        asked = time.monotonic()
        try:
            reply = await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(self.client.call, "model_demand", alias=alias))
        except BadInput as error:  # the service's catalog is not the gateway's (a config changed under one of them)
            raise Refused(503, f"the board service cannot start {alias}: {error}", "server_error",
                          "model_unavailable", retry_after=UNKNOWN_RETRY_S) from None
        except BoardError as error:
            log.warning(f"board gateway: cannot ask the service to start {alias}: {error}")
            raise Refused(503, f"the gateway cannot reach the board service to start {alias}; try again in a few"
                               " seconds", "server_error", "service_unavailable", retry_after=5) from None
        if reply.get("state") == "starting" and self.starts.get(alias, (None,))[0] != reply.get("booking"):
            self.starts[alias] = (reply.get("booking"), asked)  # a new booking: a cold start, measured once ready
            self.metrics.cold_starts.labels(alias).inc()
            log.info(f"board gateway: starting {alias} on cards {_cards(reply.get('cards'))} (booking"
                     f" {reply.get('booking')})")
        elif reply.get("state") == "unavailable":
            log.info(f"board gateway: {alias} cannot start now: {reply.get('message')}")
        return reply

    # -- what the service hears -----------------------------------------------------------------

    def updated(self) -> None:
        """A new state: each cold start whose server now takes requests is measured (and one never ready forgotten)."""
        now = time.monotonic()
        for alias, (_, asked) in list(self.starts.items()):
            if self.router.serves(alias):
                del self.starts[alias]
                self.metrics.cold_start_seconds.labels(alias).observe(now - asked)
            elif now - asked > self.wait_s:
                del self.starts[alias]

    @contextlib.contextmanager
    def using(self, alias: str):
        """A request of catalog alias `alias` in flight or waiting: touched while it lasts and once after."""
        self.busy[alias] += 1
        try:
            yield
        finally:
            self.busy[alias] -= 1
            if not self.busy[alias]:
                del self.busy[alias]
            self.used.add(alias)

    async def touch(self) -> None:
        """The aliases used since the last touch go to the service (models_touch), which keeps their leases; a
        service away: skipped and logged (the next touch carries what is still in use)."""
        aliases = sorted(set(self.busy) | self.used)
        self.used = set()
        if not aliases:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(self.client.call, "models_touch", aliases=aliases))
        except BoardError as error:
            log.warning(f"board gateway: cannot keep {', '.join(aliases)} in use: {error}")

    # -- /v1/models -----------------------------------------------------------------------------

    def state(self, alias: str) -> str:
        """A catalog alias as /v1/models shows it: ready, draining, starting or cold."""
        if self.router.serves(alias):
            return "ready"
        if alias in self.starts or alias in self.calls:
            return "starting"
        return "draining" if alias in self.router.models() else "cold"


def _seconds(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else UNKNOWN_RETRY_S


def _cards(cards: Any) -> str:
    from app.core.ical import card_ranges

    return card_ranges([c for c in cards or () if isinstance(c, int)]) or "-"

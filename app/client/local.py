"""The service in this process, for a database file the caller owns. Replies go through JSON, as on the wire,
and their time stamps are worded here, as the socket client words them (app.client.stamps)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterator

from app import wire
from app.client.stamps import worded
from app.core.identity import Identity, current_identity
from app.errors import BadInput, BoardError
from app.gpu.fleet import Fleet
from app.service import Service, open_service


class LocalClient:
    transport = "local"

    def __init__(self, service: Service, me: Identity) -> None:
        """`me` is the caller's Identity: the user who owns the file (tests and screenshots pass another)."""
        self.service, self.me = service, me
        self._watchers: threading.Event | None = None
        self._subscribers: list = []

    @classmethod
    def open(cls, config, *, demo=None, environ=None) -> "LocalClient":
        return cls(open_service(config, demo=demo, environ=environ), current_identity(config.admin_group))

    @classmethod
    def on(cls, config, source, me, *, clock=time.time, demo: bool = False) -> "LocalClient":
        """The service in process on `config.db_path` with this fleet and clock, for `me` (tests, screenshots)."""
        return cls(Service(config, Fleet(source, config.refresh_seconds), clock=clock, demo=demo), me)

    def call(self, op: str, **args: Any) -> Any:
        # The same JSON round trips as the socket: the arguments decoded as the service decodes a request
        # (a lone surrogate is refused alike), and the answer in the same shapes and words.
        try:
            args = wire.decode(wire.encode(args))
        except ValueError as error:
            raise BadInput(f"{str(op)[:40]}: {error}") from None
        try:
            result = self.service.call(self.me, op, args)
        except BoardError as error:
            if (said := worded(str(error))) != str(error):
                error.args = (said,)
            raise
        return json.loads(worded(json.dumps(result)))

    def subscribe(self, kinds: tuple[str, ...]) -> Iterator[dict[str, Any]]:
        subscriber = self.service.hub.subscribe(kinds, self.me.uid)
        self._subscribers.append(subscriber)
        if self._watchers is None:
            from app.service.box.watch import start_watchers  # start-up: a command that does not watch starts none

            self._watchers = start_watchers(self.service)
        try:
            while not subscriber.closed:
                for event in subscriber.take(timeout=1.0):
                    # A notice is the one event worded for people; the hub shares it, so it is copied.
                    text = event.get("message")
                    yield {**event, "message": worded(text)} if isinstance(text, str) else event
        finally:
            self.service.hub.unsubscribe(subscriber)

    def close(self) -> None:
        for subscriber in self._subscribers:
            self.service.hub.unsubscribe(subscriber)
        if self._watchers is not None:
            self._watchers.set()
        self.service.close()

"""Fan-out of change events to subscribers. A subscriber that falls behind gets the latest event of each kind, never a backlog."""

from __future__ import annotations

import threading
from typing import Any


class Subscriber:
    def __init__(self, kinds: frozenset[str], uid: int | None = None):
        self.kinds, self.uid = kinds, uid
        self._pending: dict[str, dict[str, Any]] = {}
        self._notices: list[dict[str, Any]] = []
        self._ready = threading.Condition()
        self.closed = False

    def offer(self, kind: str, event: dict[str, Any]) -> None:
        with self._ready:
            if kind == "notice":  # notices are not replaced by newer ones: each says something else
                if len(self._notices) < 100:
                    self._notices.append(event)
            else:
                self._pending[kind] = event
            self._ready.notify()

    def take(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """The events waiting (oldest kind first), after waiting up to `timeout` for one; [] when closed or timed out."""
        with self._ready:
            if not self._pending and not self._notices and not self.closed:
                self._ready.wait(timeout)
            events = [*self._pending.values(), *self._notices]
            self._pending.clear()
            self._notices.clear()
            return events

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify_all()


# The `gateway` kind (app.service.ops.gateway) changes with these, and with the keys.
GATEWAY_FOLLOWS = ("bookings", "servers")


class Hub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self.versions: dict[str, int] = {"bookings": 0, "servers": 0, "gateway": 0}

    def subscribe(self, kinds, uid: int | None = None) -> Subscriber:
        subscriber = Subscriber(frozenset(kinds), uid)
        with self._lock:
            self._subscribers.append(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        subscriber.close()
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    @property
    def count(self) -> int:
        return len(self._subscribers)

    def changed(self, kind: str) -> int:
        """A new version of `kind` (bookings, servers): every subscriber learns of it."""
        with self._lock:
            self.versions[kind] = version = self.versions.get(kind, 0) + 1
        self.publish(kind, {"version": version})
        if kind in GATEWAY_FOLLOWS:  # what the gateway routes by changed too: it re-reads gateway_state
            self.changed("gateway")
        return version

    def publish(self, kind: str, event: dict[str, Any], uid: int | None = None) -> None:
        """Send to everyone subscribed to `kind`, or only to `uid`'s subscriptions when given."""
        message = {"event": kind, **event}
        with self._lock:
            targets = [s for s in self._subscribers if kind in s.kinds and (uid is None or s.uid == uid)]
        for subscriber in targets:
            subscriber.offer(kind, message)

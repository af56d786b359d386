"""The service's side of pushes (app.notify): the call other parts use, the summary schedule and the delivery
thread. The `notify_test` / `notify_status` operations are app.service.ops.notify.

On the database thread, inside the caller's transaction if it has one (the alerts' pass, app.service.box.alerts):

    push(service, "alert.firing", "GPU 3 at 92 °C", lines=("held by alice",), fields=(("card", "3"),),
         key=f"alert:{alert_id}:firing")

The push is in the outbox when the transaction commits, and the delivery thread sends it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from app.notify import outbox
from app.notify.deliver import Deliverer
from app.notify.formats import Message
from app.notify.summary import due_slot, summary, zone
from app.service.fleet.status import status_document

if TYPE_CHECKING:
    from app.service import Service


def push(service: Service, kind: str, title: str, *, lines: Iterable[str] = (), fields: Iterable[tuple[str, str]] = (),
         key: str | None = None) -> list[int]:
    """Queue a message for every target; returns the outbox ids (none when no target is configured)."""
    now = int(service.clock())
    message = Message(kind, now, title, tuple(lines), tuple(fields))
    ids = outbox.enqueue(service.conn, service.config.notify, message, now=now, key=key)
    if ids and service.notifier is not None:
        service.notifier.wake.set()
    return ids


def queue_summary(service: Service) -> list[int]:
    """Queue the board summary if a `[notify] summary_at` time has come and its summary is not queued yet."""
    settings = service.config.notify
    if not settings.targets:
        return []
    tz = zone(service.config.policy.timezone)
    slot = due_slot(service.clock(), settings.summary_at, tz)
    if slot is None:
        return []
    key = f"summary:{slot}"
    if service.conn.execute("SELECT 1 FROM outbox WHERE key = ? LIMIT 1", (key,)).fetchone():
        return []  # the cheap path, every pass: the status below reads the fleet and the bookings
    message = summary(status_document(service), service.clock(), tz)
    return outbox.enqueue(service.conn, settings, message, now=int(service.clock()), key=key)


def deliverer(service: Service, run_db: Callable[[Callable[[], Any]], Any], log: Callable[[str], None]) -> Deliverer:
    """A Deliverer for this service: outbox work runs through `run_db`, on that thread's connection."""
    return Deliverer(service.config, service.clock, run_db, lambda: service.conn, log=log,
                     before=lambda: queue_summary(service))

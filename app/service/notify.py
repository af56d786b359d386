"""The service's side of pushes (app.notify): the call other parts use, the summary schedule, the delivery
thread, and the `notify_test` / `notify_status` operations (admins only: a test posts to the team's chat).

For alerts (issue 12 section 4), on the database thread, inside the alert's own transaction if it has one:

    from app.service.notify import push
    push(service, "alert.firing", "GPU 3 at 92 °C", lines=("held by alice",), fields=(("card", "3"),),
         key=f"alert:{alert_id}:firing")

The push is in the outbox when the transaction commits, and the delivery thread sends it.
"""

from __future__ import annotations

import threading
from typing import Iterable

from app.core.identity import Identity
from app.core.text import inert
from app.errors import BadInput, NotPermitted
from app.notify import outbox
from app.notify.deliver import Deliverer, describe
from app.notify.formats import Message
from app.service.audit import AGENT
from app.service.ops import LIST, STR, op

TEST_ATTEMPTS = 1  # a test reports its one try; it is not retried behind the admin's back


def push(service, kind: str, title: str, *, lines: Iterable[str] = (), fields: Iterable[tuple[str, str]] = (),
         key: str | None = None) -> list[int]:
    """Queue a message for every target; returns the outbox ids (none when no target is configured)."""
    now = int(service.clock())
    message = Message(kind, now, title, tuple(lines), tuple(fields))
    ids = outbox.enqueue(service.conn, service.config.notify, message, now=now, key=key)
    if ids and service.notifier is not None:
        service.notifier.wake.set()
    return ids


def queue_summary(service) -> list[int]:
    """Queue the board summary if a `[notify] summary_at` time has come and its summary is not queued yet."""
    from app.notify.summary import due_slot, summary, zone

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
    from app.service.ops import status

    message = summary(status(service, AGENT), service.clock(), tz)
    return outbox.enqueue(service.conn, settings, message, now=int(service.clock()), key=key)


def deliverer(service, run_db, log) -> Deliverer:
    """A Deliverer for this service: outbox work runs through `run_db`, on that thread's connection."""
    return Deliverer(service.config, service.clock, run_db, lambda: service.conn, log=log,
                     before=lambda: queue_summary(service))


def start_notifier(server) -> threading.Thread:
    """The delivery thread of a ServiceServer: database work on its database thread, HTTP on this one."""
    service = server.service
    service.notifier = deliverer(service, lambda fn: server.database.submit(fn).result(), server.log)
    thread = threading.Thread(target=service.notifier.run, args=(server.stopping,), name="board-notify", daemon=True)
    thread.start()
    return thread


def _admin(service, me: Identity, what: str) -> None:
    if not me.is_admin:
        raise NotPermitted(f"{what} is for admins (group {service.config.admin_group}): it posts to the team's chat")


@op("notify_test", {}, {"target": STR})
def notify_test(service, me: Identity, target: str | None = None) -> dict:
    """Queue one test message to each target (or the named one), ahead of everything else; returns the ids to
    follow with notify_status. Without a delivery thread (the service in this process) it is sent here."""
    from app.store import events
    from app.store.db import write

    _admin(service, me, "board notify test")
    settings = service.config.notify
    names = [t.name for t in settings.targets]
    if not names:
        raise BadInput(f"no [[notify.targets]] in {service.config.path or 'the config'}; add one with type and url")
    if target is not None and target not in names:
        raise BadInput(f"no target {inert(target, 40)!r}; the targets are: {', '.join(names)}")
    now = int(service.clock())
    chosen = tuple(names if target is None else [target])
    message = Message("test", now, "board: a test message",
                      (f"{me.name} sent this with 'board notify test'. Alerts and the board summary come here.",))
    with write(service.conn):
        ids = outbox.enqueue(service.conn, settings, message, now=now, targets=chosen, max_attempts=TEST_ATTEMPTS)
        events.record(service.conn, ts=now, uid=me.uid, actor=me.name, action="notify-test", booking_id=None,
                      ok=True, details={"targets": list(chosen)})
    if service.notifier is not None:
        service.notifier.wake.set()
    else:
        inline = deliverer(service, lambda fn: fn(), lambda line: None)  # the outcome is the answer
        for row in outbox.rows(service.conn, ids):
            inline.deliver(row)
    return {"ids": ids, "wait_s": settings.timeout_s * (len(ids) + 1) + 30}


@op("notify_status", {"ids": LIST})
def notify_status(service, me: Identity, ids: list) -> list:
    """Where these outbox rows stand: state, attempts, the last HTTP status and error (never a url)."""
    _admin(service, me, "board notify status")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 < i < 2**63 for i in ids) or len(ids) > 100:
        raise BadInput("notify_status: ids is a list of up to 100 outbox ids")
    targets = {t.name: t for t in service.config.notify.targets}
    return [{"id": r.id, "target": r.target, "where": describe(targets[r.target]) if r.target in targets else r.target,
             "state": r.state, "attempts": r.attempts, "status": r.last_status, "error": r.last_error}
            for r in outbox.rows(service.conn, ids)]

